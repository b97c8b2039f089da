-- read_levels.lua: read new entries from a queue's priority levels, highest first, in one step.
--
-- KEYS[1..n] the levels' streams, highest priority first (one consumer group on each)
-- KEYS[n+1] optional: the queue's cancellation marks (cancel.lua), whether any exist is returned
-- ARGV[1]   the consumer group
-- ARGV[2]   this consumer's name
-- ARGV[3]   how many entries at most (the free slots)
-- ARGV[4]   ignored (it was the caller's clock; kept in place so callers need not change)
-- ARGV[5]   starvation_after in ms, or 0: a lower level whose next new entry has waited that
--           long gives one entry first (aging), before the strict order. How long it waited is
--           Redis's clock (TIME) minus its id's time (set by Redis's clock too, at XADD *): the
--           same answer from every host, however far its own clock is off
-- ARGV[6]   n, how many of KEYS are levels (default: all)
--
-- Returns {entries, newest, marks}: marks is 1 when the cancellation marks key exists (the
-- reader then asks which entries are cancelled: cancelled.lua), after the read; entries is a list of {level index, id, fields}, taken from the
-- highest non-empty level first and then the next; when none was read, newest lists each
-- level's newest entry id ('0-0' when empty), for the reader to wait for entries after them
-- (XREAD BLOCK) without holding any. Strict priority: a level is read only when every higher
-- level had no new entry left.
local out, left = {}, tonumber(ARGV[3])
local levels = tonumber(ARGV[6]) or #KEYS
local after = tonumber(ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function read(i, count)
  local reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', count,
                           'STREAMS', KEYS[i], '>')
  if reply then
    for _, e in ipairs(reply[1][2]) do
      out[#out + 1] = {i, e[1], e[2]}
      left = left - 1
    end
  end
end

-- Whether the next entry the group has not read yet from level i waited past `after`.
local function starving(i)
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[i])) do
    local fields = {}
    for j = 1, #g, 2 do fields[g[j]] = g[j + 1] end
    if fields['name'] == ARGV[1] then
      local nxt = redis.call('XRANGE', KEYS[i], '(' .. fields['last-delivered-id'], '+', 'COUNT', 1)
      return #nxt == 1 and now - tonumber(string.match(nxt[1][1], '^(%d+)')) >= after
    end
  end
  return false
end

if after > 0 then
  for i = 2, levels do
    if left > 0 and starving(i) then read(i, 1) end
  end
end
for i = 1, levels do
  if left <= 0 then break end
  read(i, left)
end
local newest = {}
if #out == 0 then
  for i = 1, levels do
    local last = redis.call('XREVRANGE', KEYS[i], '+', '-', 'COUNT', 1)
    newest[i] = (#last == 0) and '0-0' or last[1][1]
  end
end
local marks = (levels < #KEYS) and redis.call('EXISTS', KEYS[levels + 1]) or 0
return {out, newest, marks}
