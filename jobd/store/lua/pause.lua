--! uses jobs.lua
-- pause.lua: pause a queue: while its pause key exists, no daemon's reader reads from it, so no
-- new job of the queue starts (running ones finish; the delayed set and periodic ticks go on).
--
-- KEYS[1]   the queue's pause key (a hash: since, by)
-- KEYS[2..5] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- ARGV[1]   who pauses it (user@host)
-- ARGV[2]   the history's settings (lib/jobs.lua history_at)
--
-- Returns {since (Redis ms), by, 1} when this call paused it, or the pause in force with 0.
-- A key of another type there (someone else's) is replaced: the queue is paused from now. The
-- pause is in the queue's events (event pause, by) in the same step; a pause already in force
-- writes nothing.
local cur = redis.pcall('HMGET', KEYS[1], 'since', 'by')
if cur.err then
  redis.call('DEL', KEYS[1])
  cur = {}
end
if cur[1] then
  return {cur[1], cur[2] or '', 0}
end
local t = redis.call('TIME')
local since = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
redis.call('HSET', KEYS[1], 'since', since, 'by', ARGV[1])
emit(history_at(2, ARGV[2]), 'pause', {'by', ARGV[1]})
return {since, ARGV[1], 1}
