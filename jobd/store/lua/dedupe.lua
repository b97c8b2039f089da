--! uses jobs.lua workflows.lua
-- dedupe.lua: acknowledge, without running them, new deliveries of jobs already done.
--
-- KEYS[1]   the queue's stream
-- KEYS[2]   the queue's counters for this minute (a hash)
-- KEYS[3..6] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- KEYS[7], KEYS[8] the queue's waiters hash and outbox: a job deduped is done, and its batch
--           and the jobs waiting for it are told so (lib/workflows.lua ended)
-- KEYS[9..] the job id marks of the entries just read (jobd/store/keys.py, "job:J")
-- ARGV[1]   the consumer group
-- ARGV[2]   this consumer's name
-- ARGV[3]   seconds the counters are kept
-- ARGV[4]   the history's settings (lib/jobs.lua history_at)
-- ARGV[5..] per entry, in the order of KEYS[9..]: its id, its job id, its origin ('' when its
--           entry carries none: jobd.job ORIGIN), its batch (jobd_batch; '' for none) and which
--           batch of that id (jobd_batch_incarnation; '' for none: lib/workflows.lua ended)
--
-- An entry whose job id's mark says 'done' (its job completed within the dedupe window, the
-- mark written by settle.lua in the same step as that ack) is acknowledged here and counted as
-- 'deduped', and gets an event 'deduped' (job, entry, origin): how a producer waiting for it
-- (jobd.waiting) learns that it ended, its result the earlier run's. Its history record
-- ('deduped', the entry) is written only when the job's records have room for it: one more
-- record must never push out the done record whose result the waiter reads. Returns the ids
-- of the done ones (see below); the reader runs the others. A job deduped is an end (done: lib/workflows.lua
-- ENDS), told to its batch and to the jobs waiting for it in the same step, as any end is.
--
-- Only an entry this consumer still holds is acknowledged and told (as settle.lua and
-- cancelled.lua do): a reader that stalled past lease.reclaim_after between its read and this
-- call finds the entry taken over (and maybe deduped, or run, there) or acknowledged already;
-- its end was told by whoever holds it, and telling it again would count a batch member twice.
-- Such an entry whose mark says done is returned too (not to be run here: it is done) but
-- gets nothing written. A stream of another type or a group gone: nothing is held.
local stream, group, me = KEYS[1], ARGV[1], ARGV[2]
local readable = nil -- whether the group can be asked (at the first done entry: no write yet)
local function held_by(id)
  if readable == nil then
    local there = redis.pcall('XPENDING', stream, group)
    readable = type(there) == 'table' and not there.err
  end
  if not readable then return false end
  local p = redis.call('XPENDING', stream, group, id, id, 1)
  return #p == 1 and p[1][2] == me
end
local h, now = history_at(3, ARGV[4]), now_ms()
local out, acked = {}, 0
local w = nil -- lib/workflows.lua workflow_at, looked at once something is deduped
for k = 9, #KEYS do
  local a = 5 + 5 * (k - 9)
  local id, job, origin, batch = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local incarnation = ARGV[a + 4]
  -- pcall: a mark of another type (someone else's key) is no mark, not an error for the batch
  local done = redis.pcall('GET', KEYS[k]) == 'done'
  if done then out[#out + 1] = id end -- not run by this reader, whether it holds it or not
  if done and held_by(id) and redis.call('XACK', stream, group, id) == 1 then
    acked = acked + 1
    if origin == '' then origin = nil end
    local record = cjson.encode({event = 'deduped', stream = KEYS[1], entry = id,
      origin = origin, detail = 'done within the dedupe window: acknowledged unrun'})
    local old = h.records and redis.call('HGET', h.hash, job)
    local note = linked({event = 'deduped', job = job, record = record,
      extras = with_origin({}, origin)}, batch, incarnation)
    -- its head (at; the batch link lib/jobs.lua linked keeps, none for a jobd_batch it drops:
    -- escaped six times over at most, and which batch of the id, 32 digits at most)
    local fits = old and #old + 110 + 6 * #(note.batch or '') + #record <= HISTORY_BYTES
    remember({emits = h.emits, events = h.events, events_max = h.events_max, queue = h.queue,
      records = fits, hash = h.hash, at = h.at}, note, now, id)
    w = w or workflow_at(7, h.queue)
    ended(w, job, 'deduped', batch ~= '' and batch or nil, incarnation)
  end
end
if acked > 0 then
  -- After the acks: someone else's key at the counters' name leaves the count out, never the
  -- script half-done (the reader would run the batch, the acked jobs included).
  if type(redis.pcall('HINCRBY', KEYS[2], 'deduped', acked)) == 'number' then
    redis.pcall('EXPIRE', KEYS[2], ARGV[3])
  end
end
return out
