-- resume.lua: resume a paused queue (delete its pause key).
--
-- KEYS[1]   the queue's pause key
--
-- Returns {since, by} of the pause it ended, or an empty list when the queue was not paused.
local cur = redis.call('HMGET', KEYS[1], 'since', 'by')
redis.call('DEL', KEYS[1])
if not cur[1] then
  return {}
end
return {cur[1], cur[2] or ''}
