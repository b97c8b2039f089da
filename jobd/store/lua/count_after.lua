-- count_after.lua: how many entries a stream holds after an id: a group's lag, when Redis
-- reports it as null (an entry deleted after the group's last delivered one, by hand with XDEL).
-- Counted in Redis, bounded: at most ARGV[2] entries, read ARGV[3] at a time (so at most that
-- many whole entries in the script's memory); only the count leaves Redis.
--
-- KEYS[1]  the stream
-- ARGV[1]  the id after which entries are counted (exclusive)
-- ARGV[2]  at most this many entries counted
-- ARGV[3]  entries read per XRANGE
--
-- Read-only. Returns {count, 1 when that is all of them, 0 when more follow (at least count)}.
local from, cap, step = '(' .. ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local counted = 0
while counted < cap do
  local asked = math.min(step, cap - counted)
  local rows = redis.call('XRANGE', KEYS[1], from, '+', 'COUNT', asked)
  counted = counted + #rows
  if #rows < asked then return {counted, 1} end
  from = '(' .. rows[#rows][1]
end
return {counted, #redis.call('XRANGE', KEYS[1], from, '+', 'COUNT', 1) == 0 and 1 or 0}
