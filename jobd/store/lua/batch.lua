--! uses jobs.lua
-- batch.lua: a batch of jobs (`jobd enqueue --batch ID`), its counts in one hash, in a slot of its
-- own (jobd/store/keys.py batch): who adds to it opens it and seals it when done adding; each
-- member's end is counted once (its notice may be moved twice: the members set says); the batch
-- is complete once sealed with every member counted, and says so to whoever asks after that
-- (the callback's own mark makes it once: callback.lua).
--
-- KEYS[1]   the batch's hash: state (open, sealed, complete), open (adders at work), total,
--           done, failed, ttl, created, completed (Redis ms), incarnation, on_complete,
--           callback (JSON)
-- KEYS[2]   the ends counted: a set of the notices that told them ("OUTBOX ENTRY_ID": one a
--           member's end, written in the step that ended it), so that two jobs of one job id
--           are two members, and a notice moved twice counts once
-- ARGV[1]   the operation:
--   open TTL ON_COMPLETE CALLBACK   one more adder; refused (an error) once complete
--   add N                           N more members (N < 0: fewer, those Redis refused)
--   seal                            one adder less; sealed when none is left
--   count NOTICE OUTCOME            a member's end, told by NOTICE (outcome done, failed or
--                                   cancelled)
--   show                            nothing changes
-- Both keys expire TTL seconds (the history's max_age) after the batch's latest change.
--
-- A batch made where one of the same id expired is another batch: its incarnation (Redis's time
-- in µs when it was made) names its callback's mark, so the mark of the one before (which may
-- outlive it) is not its own.
--
-- Returns {state, total, done, failed, on_complete, callback, incarnation, ttl}; {} when there
-- is no such batch (expired, never made, or someone else's key there) for count and show; an
-- error, having written nothing, when open, add or seal find someone else's key.
local b, members, op = KEYS[1], KEYS[2], ARGV[1]
local function ours()
  local tb, tm = redis.call('TYPE', b).ok, redis.call('TYPE', members).ok
  return (tb == 'hash' or tb == 'none') and (tm == 'set' or tm == 'none')
end
if not ours() then
  if op == 'count' or op == 'show' then return {} end
  return redis.error_reply('WRONGTYPE batch.lua: ' .. b .. ' or its members set is not a batch')
end
-- Seconds the batch's keys are kept (ttl), 1 to 10 years whatever was written there.
local function ttl_of(v)
  local s = math.floor(tonumber(v) or 1)
  if not (s >= 1) then return '1' end -- NaN too
  return string.format('%d', math.min(s, 10 * 365 * 86400))
end
local function status()
  local v = redis.call('HMGET', b, 'state', 'open', 'total', 'done', 'failed', 'on_complete',
    'callback', 'incarnation', 'created', 'ttl')
  local n = {} -- the numbers, 0 for one missing or that is none (someone wrote it)
  for i = 2, 5 do n[i] = math.floor(tonumber(v[i]) or 0) end
  local state = v[1] or 'open'
  if state ~= 'complete' and n[2] <= 0 and n[4] + n[5] >= n[3] then
    state = 'complete'
    redis.call('HSET', b, 'state', state, 'completed', string.format('%d', now_ms()))
  end
  return {state, string.format('%d', n[3]), string.format('%d', n[4]),
    string.format('%d', n[5]), v[6] or '', v[7] or '', v[8] or v[9] or '',
    ttl_of(v[10])}
end
local function keep()
  local ttl = ttl_of(redis.call('HGET', b, 'ttl'))
  redis.call('EXPIRE', b, ttl)
  if redis.call('EXISTS', members) == 1 then redis.call('EXPIRE', members, ttl) end
end
if op == 'open' then
  if redis.call('HGET', b, 'state') == 'complete' then
    return redis.error_reply('ERR batch complete: it takes no more jobs')
  end
  if redis.call('EXISTS', b) == 0 then
    local t = redis.call('TIME')
    redis.call('DEL', members) -- of a batch of this id before, if it outlived its hash
    redis.call('HSET', b, 'total', 0, 'done', 0, 'failed', 0, 'open', 0,
      'created', string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)),
      'incarnation', string.format('%s%06d', t[1], tonumber(t[2])))
  end
  redis.call('HINCRBY', b, 'open', 1)
  redis.call('HSET', b, 'state', 'open', 'ttl', ARGV[2])
  if ARGV[3] ~= '' then
    redis.call('HSETNX', b, 'on_complete', ARGV[3])
    redis.call('HSETNX', b, 'callback', ARGV[4])
  end
  keep()
  return status()
end
if redis.call('EXISTS', b) == 0 then return {} end
if op == 'add' then
  redis.call('HINCRBY', b, 'total', ARGV[2])
elseif op == 'seal' then
  if redis.call('HINCRBY', b, 'open', -1) <= 0 and redis.call('HGET', b, 'state') == 'open' then
    redis.call('HSET', b, 'open', 0, 'state', 'sealed')
  end
elseif op == 'count' then
  if redis.call('SISMEMBER', members, ARGV[2]) == 0 then
    -- Counted first: a count that is no integer (someone wrote it) fails before the notice is
    -- marked counted, and the notice stays to be moved again.
    redis.call('HINCRBY', b, ARGV[3] == 'done' and 'done' or 'failed', 1)
    redis.call('SADD', members, ARGV[2])
  end
elseif op ~= 'show' then
  return redis.error_reply('ERR batch.lua: unknown operation ' .. op)
end
if op ~= 'show' then keep() end
return status()
