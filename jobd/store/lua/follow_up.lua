--! uses jobs.lua
-- follow_up.lua: move follow-ups out of an outbox into their queue (on a Redis Cluster, where
-- the parent's acknowledgement wrote them into its own queue's outbox: store/outbox.py), each
-- once: a follow-up whose mark exists was moved already (by a mover that died before it could
-- remove it from the outbox, or by another at the same time) and is not added again.
--
-- KEYS[1]   the queue's stream
-- KEYS[2]   the queue's delayed set
-- KEYS[3..] the marks of the follow-ups (jobd/store/keys.py follow_up), in this slot
-- ARGV[1]   seconds a mark is kept (keys.FOLLOW_UP_TTL)
-- ARGV[2..] per mark, in order: due time ('' for now; Unix ms or '+MS'), delayed member id,
--           the job's fields (cmsgpack array name, value, …, as settle.lua packed them)
--
-- Returns {added, already there, {the positions (1: the first) of those that are no follow-up
-- jobd wrote: fields not a cmsgpack array of 1 to MAX_FIELDS name, value pairs (wider, XADD's
-- unpack fails: "too many results to unpack", about 8 000 values); skipped, for the caller to
-- remove}}; an error, having written nothing, when the stream or the delayed set is someone
-- else's key of another type.
if not can_add(KEYS[1], KEYS[2]) then
  return redis.error_reply('WRONGTYPE follow_up.lua: ' .. KEYS[1] .. ' or its delayed set')
end

-- The fields packed in ``packed``, or nil when they are not 1 to MAX_FIELDS name, value pairs
-- of text (lib/jobs.lua).
local function unpacked(packed)
  local ok, fields = pcall(cmsgpack.unpack, packed)
  if not ok or type(fields) ~= 'table' or #fields == 0 or #fields % 2 ~= 0 then return nil end
  if #fields > 2 * MAX_FIELDS then return nil end
  for i = 1, #fields do  -- by index: ipairs stops at a nil, which # may count (cmsgpack)
    local v = fields[i]
    if type(v) ~= 'string' and type(v) ~= 'number' then return nil end
  end
  return fields
end

local added, there, garbage = 0, 0, {}
for k = 3, #KEYS do
  local a = 2 + 3 * (k - 3)
  local fields = unpacked(ARGV[a + 2])
  if not fields then
    garbage[#garbage + 1] = k - 2
  elseif redis.call('EXISTS', KEYS[k]) == 1 then
    there = there + 1
  else
    add_job(KEYS[1], KEYS[2], ARGV[a], ARGV[a + 1], fields)
    redis.call('SET', KEYS[k], '1', 'EX', ARGV[1])
    added = added + 1
  end
end
return {added, there, garbage}
