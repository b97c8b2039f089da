--! uses jobs.lua
-- dedupe.lua: acknowledge, without running them, new deliveries of jobs already done.
--
-- KEYS[1]   the queue's stream
-- KEYS[2]   the queue's counters for this minute (a hash)
-- KEYS[3..6] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- KEYS[7..] the job id marks of the entries just read (jobd/store/keys.py, "job:J")
-- ARGV[1]   the consumer group
-- ARGV[2]   seconds the counters are kept
-- ARGV[3]   the history's settings (lib/jobs.lua history_at)
-- ARGV[4..] per entry, in the order of KEYS[7..]: its id, its job id, its origin ('' when its
--           entry carries none: jobd.job ORIGIN)
--
-- An entry whose job id's mark says 'done' (its job completed within the dedupe window, the
-- mark written by settle.lua in the same step as that ack) is acknowledged here and counted as
-- 'deduped', and gets an event 'deduped' (job, entry, origin): how a producer waiting for it
-- (jobd.waiting) learns that it ended, its result the earlier run's. Its history record
-- ('deduped', the entry) is written only when the job's records have room for it: one more
-- record must never push out the done record whose result the waiter reads. Returns the ids
-- acknowledged; the reader runs the others.
local h, now = history_at(3, ARGV[3]), now_ms()
local out = {}
for k = 7, #KEYS do
  local a = 4 + 3 * (k - 7)
  local id, job, origin = ARGV[a], ARGV[a + 1], ARGV[a + 2]
  -- pcall: a mark of another type (someone else's key) is no mark, not an error for the batch
  if redis.pcall('GET', KEYS[k]) == 'done' then
    redis.call('XACK', KEYS[1], ARGV[1], id)
    out[#out + 1] = id
    if origin == '' then origin = nil end
    local record = cjson.encode({event = 'deduped', stream = KEYS[1], entry = id,
      origin = origin, detail = 'done within the dedupe window: acknowledged unrun'})
    local old = h.records and redis.call('HGET', h.hash, job)
    local fits = old and #old + 40 + #record <= HISTORY_BYTES
    remember({emits = h.emits, events = h.events, events_max = h.events_max, queue = h.queue,
      records = fits, hash = h.hash, at = h.at},
      {event = 'deduped', job = job, record = record, extras = with_origin({}, origin)}, now, id)
  end
end
if #out > 0 then
  -- After the acks: someone else's key at the counters' name leaves the count out, never the
  -- script half-done (the reader would run the batch, the acked jobs included).
  if type(redis.pcall('HINCRBY', KEYS[2], 'deduped', #out)) == 'number' then
    redis.pcall('EXPIRE', KEYS[2], ARGV[2])
  end
end
return out
