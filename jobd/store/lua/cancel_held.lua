--! uses jobs.lua workflows.lua
-- cancel_held.lua: `jobd cancel` of jobs held until others end (hold.lua): each one held is held
-- no more, recorded cancelled (by), counted, and its end told to its batch and to the jobs
-- waiting for it (lib/workflows.lua ended), in one step. Its registrations with the jobs it
-- waited for are taken off by notices in its outbox (lib/workflows.lua unregister); one told
-- before they are moved finds it gone (unblock.lua) and changes nothing. Its 'job:'
-- cancellation marks (cancel.lua, one a level, set as it was found nowhere else) go too, as
-- cancel_delayed.lua's do: left behind, they would cancel the job id's next enqueue.
--
-- KEYS[1..3] the queue's held hash, after hash and held:until set
-- KEYS[4..7] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- KEYS[8], KEYS[9] the queue's waiters hash and outbox
-- KEYS[10]  the queue's counters of this minute
-- KEYS[11..] the cancellation marks (cancel.lua) of the queue's streams (each level's: ARGV[4]
--           of them), then the job ids' marks (store/keys.py job_mark), in their order: a
--           --unique held job's goes with it (lib/workflows.lua unmark)
-- ARGV[1]   the history's settings; ARGV[2] who cancels (user@host); ARGV[3] seconds the
--           counters are kept; ARGV[4] how many levels
-- ARGV[5..] job ids
--
-- Returns {cancelled job ids, notices written into the outbox}.
local h, now = history_at(4, ARGV[1]), now_ms()
local w, out = nil, {}
local marks = {}
local levels = tonumber(ARGV[4])
for k = 11, 10 + levels do
  if redis.call('TYPE', KEYS[k]).ok == 'zset' then marks[#marks + 1] = KEYS[k] end
end
for i = 5, #ARGV do
  local j = held_at(1, ARGV[i])
  if j then
    w = w or workflow_at(8, h.queue)
    unregister(w, j)
    unhold(j)
    unmark(j, KEYS[10 + levels + i - 4])
    local origin = origin_of(j.fields) -- a producer waiting for it knows its end by it
    remember(h, linked({event = 'cancelled', job = j.job,
      extras = with_origin({'by', ARGV[2]}, origin),
      record = cjson.encode({event = 'cancelled', by = ARGV[2], origin = origin,
        detail = 'held (waiting for other jobs): cancelled unrun'})}, j.batch, j.incarnation), now,
      nil)
    ended(w, j.job, 'cancelled', j.batch, j.incarnation)
    for _, m in ipairs(marks) do redis.call('ZREM', m, 'job:' .. j.job) end
    out[#out + 1] = j.job
  end
end
if #out > 0 then
  trim_history(h, now)
  add_count(KEYS[10], 'cancelled', #out, ARGV[3])
end
return {out, w and w.sent or 0}
