-- enqueue_unique.lua: add a job unless its job id is already queued, running, or done within
-- the queue's dedupe window (`jobd enqueue --unique`).
--
-- KEYS[1]   the queue's stream
-- KEYS[2]   the queue's delayed set
-- KEYS[3]   the job id's mark (jobd/keys.py, "job:J")
-- ARGV[1]   milliseconds the 'queued' mark lasts at most (if its job is lost)
-- ARGV[2]   when the job is due, Unix ms; 0: now (XADD), else into the delayed set
-- ARGV[3]   a unique member id for the delayed set
-- ARGV[4..] the job's fields, as name, value pairs (jobd_unique among them)
--
-- Returns {'added', stream id or ''} or {'exists', the mark: 'queued' or 'done'}. The mark
-- stays 'queued' while the job waits, runs and is retried; settle.lua and dead_letter.lua
-- clear it (or make it 'done') in the same step as the job's ack.
local state = redis.call('GET', KEYS[3])
if state then
  return {'exists', state}
end
redis.call('SET', KEYS[3], 'queued', 'PX', ARGV[1])
if ARGV[2] == '0' then
  local args = {KEYS[1], '*'}
  for i = 4, #ARGV do args[#args + 1] = ARGV[i] end
  return {'added', redis.call('XADD', unpack(args))}
end
local member = {ARGV[3]}
for i = 4, #ARGV do member[#member + 1] = ARGV[i] end
redis.call('ZADD', KEYS[2], ARGV[2], cmsgpack.pack(member))
return {'added', ''}
