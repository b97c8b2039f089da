-- dedupe.lua: acknowledge, without running them, new deliveries of jobs already done.
--
-- KEYS[1]   the queue's stream
-- KEYS[2]   the queue's counters for this minute (a hash)
-- KEYS[3..] the job id marks of the entries just read (jobd/store/keys.py, "job:J")
-- ARGV[1]   the consumer group
-- ARGV[2]   seconds the counters are kept
-- ARGV[3..] the entries' ids, ARGV[i] belonging to KEYS[i]
--
-- An entry whose job id's mark says 'done' (its job completed within the dedupe window, the
-- mark written by settle.lua in the same step as that ack) is acknowledged here and counted as
-- 'deduped'. Returns the ids acknowledged; the reader runs the others.
local out = {}
for i = 3, #KEYS do
  -- pcall: a mark of another type (someone else's key) is no mark, not an error for the batch
  if redis.pcall('GET', KEYS[i]) == 'done' then
    redis.call('XACK', KEYS[1], ARGV[1], ARGV[i])
    out[#out + 1] = ARGV[i]
  end
end
if #out > 0 then
  redis.call('HINCRBY', KEYS[2], 'deduped', #out)
  redis.call('EXPIRE', KEYS[2], ARGV[2])
end
return out
