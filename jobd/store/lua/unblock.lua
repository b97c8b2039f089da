--! uses jobs.lua chains.lua workflows.lua
-- unblock.lua: job ARGV[2] ended (ARGV[3] outcome, ARGV[4] its event), and held job ARGV[1] of this
-- queue waited for it (hold.lua): once per dependency (one told again is 'seen'), the held job is
-- released into its stream (or delayed set) when it waited for no other, dead-lettered with
-- jobd_error=dependency when this one did not end done (unless it runs after any outcome; its
-- record names this one and its end, as its event does), else it waits on. Its end, when dead-lettered, is told on (lib/workflows.lua ended).
--
-- KEYS[1]   the queue's held hash       KEYS[2]  its after hash (hold.lua)
-- KEYS[3]   the queue's held:until set (deadlines: expire_held.lua)
-- KEYS[4]   the stream (the job's level's) KEYS[5] its delayed set
-- KEYS[6]   the dead-letter stream
-- KEYS[7..10] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- KEYS[11], KEYS[12] the queue's waiters hash and outbox (lib/workflows.lua workflow_at)
-- KEYS[13]  the queue's counters of this minute
-- KEYS[14]  the held job id's mark (store/keys.py job_mark): a --unique one's goes with it
--           when it is dead-lettered (lib/workflows.lua unmark)
-- KEYS[15]  the queue's held:ended set: the held job's end (released, dead-lettered) is kept
--           there history.max_age (lib/workflows.lua hold_ended), so that its enqueue sent
--           again does not hold it again (hold.lua)
-- KEYS[16..] the queue's on_dead_letter hook's keys, if any (lib/chains.lua held_hook_at)
-- ARGV[1..4] held job id, the dependency ("QUEUE JOB_ID"), its outcome, its event
-- ARGV[5]   the history's settings; ARGV[6] the dead-letter stream's MAXLEN; ARGV[7] seconds
--           the counters are kept
-- ARGV[8]   the hook's job id for this held job (store/chains.py held_hook_args)
-- ARGV[9]   the hold the notice was written for (its delayed member id: store/workflows.py
--           waiter_line), '' for any (a line written before lines named their hold); then from
--           ARGV[10] the hook (lib/chains.lua held_hook_at: 0 for none)
--
-- Returns {what, notices}: what is released, dead, waiting, seen (told already) or gone (no
-- such held job: released, dead-lettered or cancelled already; or the job id held anew since,
-- by another hold than the one the notice names); notices written into the outbox.
local job, dep, outcome, event = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local spec, j = redis.call('HGET', KEYS[2], job), held_at(1, job)
if not spec or not j or (ARGV[9] ~= '' and ARGV[9] ~= j.member) then return {'gone', 0} end
local after = cjson.decode(spec)
local left, found = {}, false
for _, d in ipairs(after.deps) do
  if d == dep then found = true else left[#left + 1] = d end
end
if not found then return {'seen', 0} end
local h, now = history_at(7, ARGV[5]), now_ms()
if outcome ~= 'done' and not after.any then
  local w = workflow_at(11, h.queue)
  j.told = dep -- its registration with dep went with dep's end (lib/workflows.lua unregister)
  held_dead(j, h, w, now, 'dependency ' .. dep .. ' ' .. event, {'dependency', dep}, KEYS[6],
    ARGV[6], KEYS[13], ARGV[7], (held_hook_at(10)), ARGV[8], KEYS[14], nil, dep, event)
  hold_ended(KEYS[15], job, now, h.max_age)
  trim_history(h, now)
  return {'dead', w.sent}
end
if #left > 0 then
  after.deps = left
  redis.call('HSET', KEYS[2], job, cjson.encode(after))
  remember(h, linked({event = 'dependency', job = job, extras = {'dependency', dep, 'outcome',
    event, 'left', string.format('%d', #left)}, record = cjson.encode({event = 'dependency',
    dependency = dep, outcome = event, left = #left})}, j.batch, j.incarnation), now, nil)
  trim_history(h, now)
  return {'waiting', 0}
end
add_job(KEYS[4], KEYS[5], j.due, j.member, j.fields)
remark(j, KEYS[14])
unhold(j)
hold_ended(KEYS[15], job, now, h.max_age)
remember(h, linked({event = 'released', job = job, extras = {'dependency', dep, 'outcome', event},
  record = cjson.encode({event = 'released', dependency = dep, outcome = event})}, j.batch, j.incarnation),
  now,
  nil)
trim_history(h, now)
return {'released', 0}
