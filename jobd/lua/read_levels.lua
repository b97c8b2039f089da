-- read_levels.lua: read new entries from a queue's priority levels, highest first, in one step.
--
-- KEYS[1..] the levels' streams, highest priority first (one consumer group on each)
-- ARGV[1]   the consumer group
-- ARGV[2]   this consumer's name
-- ARGV[3]   how many entries at most (the free slots)
--
-- Returns {entries, newest}: entries is a list of {level index, id, fields}, taken from the
-- highest non-empty level first and then the next; when none was read, newest lists each
-- level's newest entry id ('0-0' when empty), for the reader to wait for entries after them
-- (XREAD BLOCK) without holding any. Strict priority: a level is read only when every higher
-- level had no new entry left.
local out, left = {}, tonumber(ARGV[3])
for i, key in ipairs(KEYS) do
  if left <= 0 then break end
  local reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', left,
                           'STREAMS', key, '>')
  if reply then
    for _, e in ipairs(reply[1][2]) do
      out[#out + 1] = {i, e[1], e[2]}
      left = left - 1
    end
  end
end
local newest = {}
if #out == 0 then
  for i, key in ipairs(KEYS) do
    local last = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
    newest[i] = (#last == 0) and '0-0' or last[1][1]
  end
end
return {out, newest}
