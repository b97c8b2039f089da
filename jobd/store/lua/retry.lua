--! uses jobs.lua workflows.lua
-- retry.lua: schedule a job's next attempt in the delayed set and ack its entry, in one step.
--
-- KEYS[1]   the queue's stream
-- KEYS[2]   the queue's delayed set (sorted set; same cluster slot: see jobd/store/keys.py)
-- KEYS[3]   the queue's counters for this minute (a hash)
-- KEYS[4..7] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- ARGV[1]   the consumer group
-- ARGV[2]   this consumer's name
-- ARGV[3]   the entry's id
-- ARGV[4]   milliseconds until the next attempt is due; the member's score is Redis's time
--           (TIME) plus this, so every daemon's retries are due on one clock
-- ARGV[5]   seconds the counters are kept
-- ARGV[6]   the history's settings (lib/jobs.lua history_at)
-- ARGV[7..] the attempt's note (lib/jobs.lua note_at: its record and event get "due"), then
--           the job's fields for the next attempt, as name, value pairs (jobd_job_id and
--           jobd_attempt included)
--
-- KEYS[8]   the queue's cancellation marks (cancel.lua)
-- KEYS[9], KEYS[10] the queue's waiters hash and outbox: a job cancelled instead of retried tells
--           its batch and the jobs waiting for it (lib/workflows.lua ended)
-- KEYS[11]  optional: the job's --unique mark (jobd/store/keys.py, "job:J")
--
-- An entry `jobd cancel` marked (its handler failed on its own before its SIGTERM came) gets
-- no next attempt: it is acknowledged as cancelled, its marks removed, its --unique mark
-- deleted if it still says 'queued'; returns 0 then. A cancel holds while the job can run.
--
-- A member is cmsgpack.pack({unique id, name, value, …}); the unique id (here the entry's id,
-- unique in its stream) keeps two identical jobs from collapsing into one member.
-- Returns 1, or {'not held', owner} when this consumer no longer holds the entry (then nothing
-- is written). A crash cannot split the two halves: the job is in the delayed set if and only
-- if its entry is acknowledged, and so are its history record and event.
local stream, delayed, group, me, id = KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3]
local p = redis.call('XPENDING', stream, group, id, id, 1)
if #p == 0 or p[1][2] ~= me then
  return {'not held', (#p == 0) and '' or p[1][2]}
end
local h = history_at(4, ARGV[6])
local note, first = note_at(7)
local marks, by_id = KEYS[8], 'id:' .. stream .. '|' .. id
if marks and redis.call('TYPE', marks).ok == 'zset' and redis.call('ZSCORE', marks, by_id) then
  cancelled_instead(stream, group, me, id, h, note, now_ms(), marks, by_id, KEYS[11], KEYS[3],
    ARGV[5], 'failed before jobd cancel stopped it: not retried')
  ended(workflow_at(9, h.queue), note.job, 'cancelled', batch_of(note))
  return 0
end
local member = {id}
for i = first, #ARGV do member[#member + 1] = ARGV[i] end
local now = now_ms()
local due = now + tonumber(ARGV[4])
redis.call('ZADD', delayed, due, cmsgpack.pack(member))
redis.call('XACK', stream, group, id)
not_running(h, note.job, stream, id)
remember(h, note, now, id, {'due', due})
trim_history(h, now)
add_count(KEYS[3], 'retried', 1, ARGV[5])
add_count(KEYS[3], 'failed', 1, ARGV[5])
return 1
