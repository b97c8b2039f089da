-- promote.lua: move due jobs from the delayed set to the stream.
--
-- KEYS[1]  the queue's delayed set
-- KEYS[2]  the queue's stream
-- ARGV[1]  now, Unix time in milliseconds
-- ARGV[2]  move at most this many
--
-- Returns {moved, score of the next job still waiting or false}. Each job is added to the
-- stream and removed from the set in this one script, so any number of daemons may run it at
-- once: a job is moved exactly once, and a crash between the two halves cannot happen.
local delayed, stream = KEYS[1], KEYS[2]
local due = redis.call('ZRANGEBYSCORE', delayed, '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
  local job = cmsgpack.unpack(member)
  local fields = {stream, '*'}
  for i = 2, #job do fields[#fields + 1] = job[i] end
  redis.call('XADD', unpack(fields))
  redis.call('ZREM', delayed, member)
end
local next = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
return {#due, next[2] or false}
