--! uses jobs.lua
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
-- Redis's clock (TIME), so a job due in 30 days keeps its mark 30 days plus ARGV[1]; the daemon
-- running it, and a retry, keep it longer (keep_marks.lua). A due time
-- that is neither form is an error too (nothing written).
local bad = check_fields('enqueue_unique.lua', 4, '')
if bad then return bad end
local now, due, score = due_time(ARGV[2])
if not due then return bad_due('enqueue_unique.lua', ARGV[2]) end
local state = redis.call('GET', KEYS[3])
if state then
  return {'exists', state}
end
-- Someone else's key where the job goes: refused before the mark is set ('queued' for a job
-- never added would refuse its id for days).
local into, kind = KEYS[1], 'stream'
if due > now then into, kind = KEYS[2], 'zset' end
local found = redis.call('TYPE', into).ok
if found ~= kind and found ~= 'none' then
  return redis.error_reply('WRONGTYPE enqueue_unique.lua: ' .. into .. ' is a ' .. found)
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
