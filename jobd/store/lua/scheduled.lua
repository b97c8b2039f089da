--! uses jobs.lua
-- scheduled.lua: a job `jobd enqueue --delay/--at` put in the delayed set, in its history, so
-- `jobd job` finds it delayed (a job written to the delayed set by anything else has no record
-- until it runs). Sent in the same pipeline, right after schedule.lua.
--
-- KEYS[1..4] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- ARGV[1]   the history's settings (lib/jobs.lua history_at)
-- ARGV[2]   the job id
-- ARGV[3]   its due time as schedule.lua took it: Unix ms, or '+' and ms from now
-- ARGV[4]   its batch (jobd_batch; '' or none: no batch), linked in the record (lib/jobs.lua
--           linked), ARGV[5] which batch of that id (jobd_batch_incarnation; '' or none)
--
-- A due time already come (schedule.lua sent the job to the stream) writes nothing. The record
-- is {"event":"scheduled","due":…} (its own reading of the clock: within a millisecond or two of
-- the score schedule.lua gave it) and no event. Returns 1 when written, else 0.
local now, due = due_time(ARGV[3])
if not due or due <= now then return 0 end
local h = history_at(1, ARGV[1])
remember(h, linked({event = 'scheduled', job = ARGV[2], record = '{"event":"scheduled"}',
  extras = {}, quiet = true}, ARGV[4], ARGV[5]), now, nil, {'due', due})
trim_history(h, now)
return 1
