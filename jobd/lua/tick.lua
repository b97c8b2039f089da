-- tick.lua: enqueue a periodic job for one tick, once across every daemon.
--
-- KEYS[1]   the queue's stream
-- KEYS[2]   the tick's key (jobd/keys.py, "tick:N:T")
-- KEYS[3]   the schedule's latest enqueued tick (jobd/keys.py, "schedule:N")
-- ARGV[1]   milliseconds both keys are kept (the catch-up window and a margin)
-- ARGV[2]   the tick, Unix seconds
-- ARGV[3..] the job's fields, as name, value pairs
--
-- Returns the new entry's id, or false when the tick was already enqueued (its key exists).
if not redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[1]) then
  return false
end
local latest = tonumber(redis.call('GET', KEYS[3]) or '0')
if tonumber(ARGV[2]) > latest then
  redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[1])
end
local args = {KEYS[1], '*'}
for i = 3, #ARGV do args[#args + 1] = ARGV[i] end
return redis.call('XADD', unpack(args))
