--! uses jobs.lua
-- cancelled.lua: of the entries a reader just read, acknowledge unrun those cancelled.
--
-- KEYS[1]   the stream
-- KEYS[2]   the queue's cancellation marks (see cancel.lua)
-- KEYS[3]   the queue's counters for this minute (a hash)
-- ARGV[1]   the consumer group
-- ARGV[2]   this consumer's name
-- ARGV[3]   seconds the counters are kept
-- ARGV[4..] ids of the entries read (this consumer holds them)
--
-- An entry is cancelled when a mark 'id:ENTRY' or 'job:JOB_ID' (its job id, read from its fields
-- as jobd.job does) has not expired. Such an entry is acknowledged, its marks removed, and
-- 'cancelled' counted. Expired marks are removed on the way. Returns the ids acknowledged.
local stream, marks, stats, group, me = KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2]
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', marks, '-inf', now)
if redis.call('ZCARD', marks) == 0 then return {} end
local acked = {}
for i = 4, #ARGV do
  local id = ARGV[i]
  local entry = redis.call('XRANGE', stream, id, id)
  local by_job = #entry == 1 and ('job:' .. job_id_of(id, entry[1][2])) or nil
  local mark = redis.call('ZSCORE', marks, 'id:' .. id) and ('id:' .. id)
    or (by_job and redis.call('ZSCORE', marks, by_job) and by_job)
  if mark then
    local p = redis.call('XPENDING', stream, group, id, id, 1)
    if #p == 1 and p[1][2] == me then
      redis.call('XACK', stream, group, id)
      redis.call('ZREM', marks, 'id:' .. id)
      if by_job then redis.call('ZREM', marks, by_job) end
      acked[#acked + 1] = id
    end
  end
end
if #acked > 0 then
  redis.call('HINCRBY', stats, 'cancelled', #acked)
  redis.call('EXPIRE', stats, ARGV[3])
end
return acked
