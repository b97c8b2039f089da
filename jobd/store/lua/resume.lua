-- resume.lua: resume a paused queue (delete its pause key).
--
-- KEYS[1]   the queue's pause key
--
-- Returns {since, by} of the pause it ended, or an empty list when the queue was not paused.
-- Whatever the key holds (a hash of jobd's, or anything someone else wrote), it goes.
local cur = redis.pcall('HMGET', KEYS[1], 'since', 'by')
redis.call('DEL', KEYS[1])
if cur.err then
  return {'0', '?'}
end
if not cur[1] then
  return {}
end
return {cur[1], cur[2] or ''}
