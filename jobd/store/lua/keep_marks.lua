-- keep_marks.lua: keep --unique jobs' 'queued' marks (jobd/store/keys.py, "job:J") from expiring
-- while their jobs still exist: each lease renewal of a running job, and a retry's for as long
-- past the retry's due time as enqueue_unique.lua gives a new job.
--
-- KEYS[1..] the marks (one queue's: one cluster slot)
-- ARGV[i]   milliseconds KEYS[i] must last at least from now
--
-- A mark is only lengthened, and only while it says 'queued': one that is 'done' (the dedupe
-- window), gone (its job settled meanwhile), without expiry, or someone else's key of another
-- type is left alone (the GET of another type fails inside pcall, before any write). Returns
-- how many were lengthened.
local kept = 0
for i = 1, #KEYS do
  local ms = tonumber(ARGV[i])
  if redis.pcall('GET', KEYS[i]) == 'queued' then
    local left = redis.call('PTTL', KEYS[i])
    if left >= 0 and left < ms then
      redis.call('PEXPIRE', KEYS[i], ms)
      kept = kept + 1
    end
  end
end
return kept
