-- keep.lua: entries this consumer still runs that its own reclaim took back (their lease
-- lapsed while Redis was away): renew them and undo the delivery the claim counted.
--
-- KEYS[1]   the queue's stream
-- ARGV[1]   the consumer group
-- ARGV[2]   this consumer's name
-- ARGV[3..] the entries' ids
--
-- XAUTOCLAIM counts a delivery; a job that never stopped running was not delivered again, and
-- must not come closer to max_deliveries (poison). An entry this consumer no longer holds is
-- left alone. Returns how many were kept.
local stream, group, me = KEYS[1], ARGV[1], ARGV[2]
local kept = 0
for i = 3, #ARGV do
  local p = redis.call('XPENDING', stream, group, ARGV[i], ARGV[i], 1)
  if #p == 1 and p[1][2] == me then
    local count = math.max(tonumber(p[1][4]) - 1, 1)
    redis.call('XCLAIM', stream, group, me, '0', ARGV[i], 'RETRYCOUNT', count, 'JUSTID')
    kept = kept + 1
  end
end
return kept
