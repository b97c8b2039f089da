-- retry.lua: schedule a job's next attempt in the delayed set and ack its entry, in one step.
--
-- KEYS[1]   the queue's stream
-- KEYS[2]   the queue's delayed set (sorted set; same cluster slot: see jobd/store/keys.py)
-- KEYS[3]   the queue's counters for this minute (a hash)
-- ARGV[1]   the consumer group
-- ARGV[2]   this consumer's name
-- ARGV[3]   the entry's id
-- ARGV[4]   milliseconds until the next attempt is due; the member's score is Redis's time
--           (TIME) plus this, so every daemon's retries are due on one clock
-- ARGV[5]   seconds the counters are kept
-- ARGV[6..] the job's fields for the next attempt, as name, value pairs (jobd_job_id and
--           jobd_attempt included)
--
-- A member is cmsgpack.pack({unique id, name, value, …}); the unique id (here the entry's id,
-- unique in its stream) keeps two identical jobs from collapsing into one member.
-- Returns 1, or {'not held', owner} when this consumer no longer holds the entry (then nothing
-- is written). A crash cannot split the two halves: the job is in the delayed set if and only
-- if its entry is acknowledged.
local stream, delayed, group, me, id = KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3]
local p = redis.call('XPENDING', stream, group, id, id, 1)
if #p == 0 or p[1][2] ~= me then
  return {'not held', (#p == 0) and '' or p[1][2]}
end
local member = {id}
for i = 6, #ARGV do member[#member + 1] = ARGV[i] end
local now = redis.call('TIME')
local due = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) + tonumber(ARGV[4])
redis.call('ZADD', delayed, due, cmsgpack.pack(member))
redis.call('XACK', stream, group, id)
redis.call('HINCRBY', KEYS[3], 'retried', 1)
redis.call('HINCRBY', KEYS[3], 'failed', 1)
redis.call('EXPIRE', KEYS[3], ARGV[5])
return 1
