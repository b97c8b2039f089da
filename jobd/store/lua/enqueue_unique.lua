-- enqueue_unique.lua: add a job unless its job id is already queued, running, or done within
-- the queue's dedupe window (`jobd enqueue --unique`).
--
-- KEYS[1]   the queue's stream
-- KEYS[2]   the queue's delayed set
-- KEYS[3]   the job id's mark (jobd/store/keys.py, "job:J")
-- ARGV[1]   milliseconds the 'queued' mark outlasts the job's due time (if its job is lost)
-- ARGV[2]   when the job is due: Unix ms (an absolute time; 0: now), or '+' and milliseconds
--           from now on Redis's clock ('+600000'). Due by Redis's clock (TIME): to the stream
--           now (XADD); else into the delayed set, scored by the due time
-- ARGV[3]   a unique member id for the delayed set
-- ARGV[4..] the job's fields, as name, value pairs (jobd_unique among them): 1 to MAX_FIELDS
--
-- Returns {'added', stream id or ''} or {'exists', the mark: 'queued' or 'done'}, or an error
-- (and writes nothing) when the fields are not 1 to MAX_FIELDS pairs. The mark stays 'queued'
-- while the job waits, runs and is retried; settle.lua and dead_letter.lua clear it (or make it
-- 'done') in the same step as the job's ack. It expires ARGV[1] after the due time, counted on
-- Redis's clock (TIME), so a job due in 30 days keeps its mark 30 days plus ARGV[1]. A due time
-- that is neither form is an error too (nothing written).
local MAX_FIELDS = 1000 -- jobd.job.MAX_FIELDS
local count = #ARGV - 3
if count < 2 or count % 2 == 1 then
  return redis.error_reply(string.format(
    'ERR enqueue_unique.lua: the job fields must be name, value pairs, at least one: got %d ' ..
    'argument(s)', math.max(count, 0)))
end
if count / 2 > MAX_FIELDS then
  return redis.error_reply(string.format(
    'ERR enqueue_unique.lua: %d fields, more than %d (jobd.job.MAX_FIELDS)', count / 2,
    MAX_FIELDS))
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local delay = string.match(ARGV[2], '^%+(%d+)$')
local due = delay and (now + tonumber(delay)) or tonumber(ARGV[2])
local score = delay and string.format('%d', due) or ARGV[2]
if not due then
  return redis.error_reply(
    'ERR enqueue_unique.lua: the due time must be Unix ms, or + and ms from now: got ' .. ARGV[2])
end
local state = redis.call('GET', KEYS[3])
if state then
  return {'exists', state}
end
local ttl = tonumber(ARGV[1]) + math.max(0, due - now)
redis.call('SET', KEYS[3], 'queued', 'PX', string.format('%d', ttl))
if due <= now then
  local args = {KEYS[1], '*'}
  for i = 4, #ARGV do args[#args + 1] = ARGV[i] end
  return {'added', redis.call('XADD', unpack(args))}
end
local member = {ARGV[3]}
for i = 4, #ARGV do member[#member + 1] = ARGV[i] end
redis.call('ZADD', KEYS[2], score, cmsgpack.pack(member))
return {'added', ''}
