--! uses jobs.lua
-- resume.lua: resume a paused queue (delete its pause key).
--
-- KEYS[1]   the queue's pause key
-- KEYS[2..5] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- ARGV[1]   who resumes it (user@host)
-- ARGV[2]   the history's settings (lib/jobs.lua history_at)
--
-- Returns {since, by} of the pause it ended, or an empty list when the queue was not paused.
-- Whatever the key holds (a hash of jobd's, or anything someone else wrote), it goes. Ending a
-- pause is in the queue's events (event resume, by, and the pause's since and by) in the same
-- step; resuming a queue not paused writes nothing.
local cur = redis.pcall('HMGET', KEYS[1], 'since', 'by')
local existed = redis.call('DEL', KEYS[1]) == 1
if cur.err then
  cur = {'0', '?'}
end
if not existed or not cur[1] then
  if not existed then return {} end
  cur = {'0', cur[2] or '?'}
end
emit(history_at(2, ARGV[2]), 'resume',
  {'by', ARGV[1], 'paused_since', cur[1], 'paused_by', cur[2] or ''})
return {cur[1], cur[2] or ''}
