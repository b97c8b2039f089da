--! uses jobs.lua record.lua chains.lua workflows.lua
-- dead_letter.lua: write a job's dead-letter record and acknowledge its entry, in one step.
--
-- KEYS[1]   the queue's stream
-- KEYS[2]   the queue's dead-letter stream (same cluster slot: see jobd/store/keys.py)
-- KEYS[3]   the queue's counters for this minute (a hash)
-- KEYS[4..7] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- KEYS[8]   the queue's cancellation marks (cancel.lua)
-- KEYS[9], KEYS[10] the queue's waiters hash and outbox: the job's end is told to its batch and
--           to the jobs waiting for it (lib/workflows.lua ended)
-- KEYS[11]  the queue's taken hash: a workflow job's record goes with its end (lib/workflows.lua
--           untake)
-- KEYS[12]  optional: the job id's mark (a --unique job's), deleted with the ack if 'queued'
--           (unless ARGV[9]'s hook has its first key there)
-- KEYS[..]  the on_dead_letter hook's keys, if any (lib/chains.lua)
-- ARGV[1]   the consumer group
-- ARGV[2]   this consumer's name
-- ARGV[3]   the entry's id
-- ARGV[4]   MAXLEN of the dead-letter stream (exact: dead letters are few, and a cap is a cap)
-- ARGV[5]   dead_letter.max_age in ms, or '' for none: older records are trimmed
-- ARGV[6]   seconds the counters are kept
-- ARGV[7]   the history's settings (lib/jobs.lua history_at)
-- ARGV[8]   the most bytes of each value the record copies, or '' for all (a malformed job's:
--           a refused payload or job id is not copied whole)
-- ARGV[9..] the queue's on_dead_letter hook (lib/chains.lua dead_letter_hook_at: 0 for none),
--           then the attempt's note (lib/jobs.lua note_at: event dead-lettered, expired or
--           poison), then the record's jobd_* fields, as name, value pairs
--
-- The record is the job's own fields (lib/record.lua record_copy, which record_copy.lua reads
-- for the hook's JSON of a record that clips: those not starting with jobd_, plus jobd_unique,
-- so that a requeue keeps the job unique, the producer's limits jobd_timeout, jobd_max_attempts and
-- jobd_expires_at: jobd.job.LIMIT_FIELDS, jobd_parent, and a batch member's jobd_batch and
-- jobd_batch_incarnation, so that a requeue names the batch it leaves: requeue.lua keeps neither
-- in the new entry; each by its last occurrence, the value the daemon read, and only when
-- jobd could have written it: a batch id, an incarnation no longer than 32 bytes, never
-- clipped; an earlier one is never copied: requeue.lua would name it) followed by the jobd_*
-- fields given and jobd_failed_at. An entry with more than MAX_FIELDS own fields cannot be copied (a
-- script passes at most ~8000 values to a command): its record keeps only its payload and
-- job_id, and jobd_fields says how many it had. A value longer than ARGV[8] keeps its first
-- ARGV[8] bytes, and jobd_clipped names each such field with its size ("payload 67108864"):
-- requeue.lua leaves such a record in place (its job is gone). Returns the record's id, or {'not held',
-- owner} when this consumer no longer holds the entry (then nothing is written: the entry's
-- new owner decides its fate). A crash cannot split the two halves: the record exists if and
-- only if the entry is acked, and so are the job's history record and event. Times are Redis's own (TIME): the record's jobd_failed_at and
-- the max_age cutoff agree whatever the clock of the daemon that sends this.
--
-- An entry `jobd cancel` marked (held 'id:STREAM|ENTRY', or an unexpired 'job:JOB_ID': its
-- handler failed on its own, or it is poison, expired or malformed, as the cancel landed) is
-- not dead-lettered: it is acknowledged as cancelled, as retry.lua does, its marks removed (a
-- 'job:' mark left behind would cancel the job's next enqueue, or a requeue), its --unique
-- mark deleted if it still says 'queued'; returns 0 then.
local stream, dead, group, me, id = KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3]
local p = redis.call('XPENDING', stream, group, id, id, 1)
if #p == 0 or p[1][2] ~= me then
  return {'not held', (#p == 0) and '' or p[1][2]}
end
local now = now_ms()
local h = history_at(4, ARGV[7])
local hook, at = dead_letter_hook_at(9)
local job_mark = (hook == nil or hook.first > 12) and KEYS[12] or nil
local note, first = note_at(at)
local clip = tonumber(ARGV[8])
local marks, by_id, by_job = KEYS[8], 'id:' .. stream .. '|' .. id, 'job:' .. note.job
if marks and redis.call('TYPE', marks).ok == 'zset' then
  local until_ms = redis.call('ZSCORE', marks, by_job)
  if redis.call('ZSCORE', marks, by_id) or (until_ms and tonumber(until_ms) > now) then
    cancelled_instead(stream, group, me, id, h, note, now, marks, by_id, job_mark, KEYS[3],
      ARGV[6], 'ended (' .. note.event .. ') before jobd cancel stopped it: not dead-lettered')
    local w = workflow_at(9, h.queue)
    untake(taken_at(11), w, stream, id, batch_of(note), job_mark ~= nil)
    ended(w, note.job, 'cancelled', batch_of(note))
    return 0
  end
end
local record = {dead, 'MAXLEN', ARGV[4], '*'}
local entry = redis.call('XRANGE', stream, id, id)
if #entry == 1 then record_copy(record, entry[1][2], clip) end
for i = first, #ARGV do record[#record + 1] = ARGV[i] end
local blocked = hook and dead_letter_hook_blocked(hook)
if blocked then
  record[#record + 1] = 'jobd_on_dead_letter'
  record[#record + 1] = blocked
end
record[#record + 1] = 'jobd_failed_at'
record[#record + 1] = tostring(now)
local record_id = redis.call('XADD', unpack(record))
if hook and not blocked then dead_letter_hook(hook, record_id, now, h, note.job, id) end
if ARGV[5] ~= '' then
  redis.call('XTRIM', dead, 'MINID', tostring(now - tonumber(ARGV[5])) .. '-0')
end
redis.call('XACK', stream, group, id)
not_running(h, note.job, stream, id)
remember(h, note, now, id)
trim_history(h, now)
-- Only a mark that says the job is queued: a 'done' mark belongs to another copy that
-- completed, and must outlive this one's failure.
-- (pcall: a mark of another type is someone else's key, not a reason to fail after the ack.)
if job_mark and says_queued(job_mark) then redis.call('DEL', job_mark) end
local w = workflow_at(9, h.queue)
untake(taken_at(11), w, stream, id, batch_of(note), job_mark ~= nil)
ended(w, note.job, note.event, batch_of(note))
add_count(KEYS[3], 'dead', 1, ARGV[6])
add_count(KEYS[3], 'failed', 1, ARGV[6])
return record_id
