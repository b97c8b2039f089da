--! uses shown.lua
-- count_after.lua: how many entries a stream holds after an id: a group's lag, when Redis
-- reports it as null (an entry deleted after the group's last delivered one, by hand with XDEL).
-- Counted in Redis, bounded: at most ARGV[2] entries, read ARGV[3] at a time (so at most that
-- many whole entries in the script's memory), and no more once those read hold ARGV[4] bytes,
-- each field counted FIELD_COST bytes more (lib/shown.lua: 100 000 empty fields cost as much as
-- 6 MiB): one read past them at most (jobd reads one entry at a time: status.LAG_COUNT_STEP).
-- Only the count leaves Redis.
--
-- KEYS[1]  the stream
-- ARGV[1]  the id after which entries are counted (exclusive)
-- ARGV[2]  at most this many entries counted
-- ARGV[3]  entries read per XRANGE
-- ARGV[4]  at most about this many bytes read (one XRANGE more at most)
--
-- Read-only. Returns {count, 1 when that is all of them, 0 when more may follow (at least
-- count), bytes read (as counted: the caller's budget shared among streams takes them)}.
local from, cap, step = '(' .. ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local budget, read = tonumber(ARGV[4]), 0
local counted = 0
while counted < cap do
  if read >= budget then return {counted, 0, read} end
  local asked = math.min(step, cap - counted)
  local rows = redis.call('XRANGE', KEYS[1], from, '+', 'COUNT', asked)
  counted = counted + #rows
  for _, row in ipairs(rows) do read = read + entry_cost(row) end
  if #rows < asked then return {counted, 1, read} end
  from = '(' .. rows[#rows][1]
end
local more = redis.call('XRANGE', KEYS[1], from, '+', 'COUNT', 1)
return {counted, #more == 0 and 1 or 0, read + (more[1] and entry_cost(more[1]) or 0)}
