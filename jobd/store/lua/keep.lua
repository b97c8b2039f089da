--! uses jobs.lua workflows.lua
-- keep.lua: entries this consumer still runs that its own reclaim took back (their lease
-- lapsed while Redis was away): renew them and undo the delivery the claim counted.
--
-- KEYS[1]    the queue's stream
-- KEYS[2..5] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- KEYS[6..8] the queue's waiters hash, outbox and taken hash (lib/workflows.lua lost_end)
-- KEYS[9]    the queue's cancellation marks (cancel.lua)
-- KEYS[10..] the --unique marks of the entries (jobd/store/keys.py job_mark), referred to by
--            index from ARGV (below)
-- ARGV[1]    the consumer group
-- ARGV[2]    this consumer's name
-- ARGV[3]    the history's settings (lib/jobs.lua history_at)
-- ARGV[4]    N: how many entries
-- ARGV[5..4+N] the entries' ids
-- ARGV[5+N..4+2N] their job ids, in the same order ('' or none: not known): a job whose entry
--            was deleted is recorded under it (lib/workflows.lua lost_end)
-- ARGV[5+2N..4+3N] the index in KEYS of each one's --unique mark (0 or none: none): a job whose
--            entry was deleted frees its job id (lost_end: a mark saying 'queued' goes)
--
-- XAUTOCLAIM counts a delivery; a job that never stopped running was not delivered again, and
-- must not come closer to max_deliveries (poison). An entry this consumer no longer holds is
-- left alone. On Redis 7.0+ the XCLAIM here takes an entry whose data was deleted since the
-- reclaim out of the group, and returns nothing for it: this step is the one that took it out,
-- so it records the job's end, 'lost', and tells it to its batch and waiters, once, as
-- renew.lua does (no later renewal or reclaim finds it pending), its marks going with its end
-- as renew.lua's do: its cancellation marks and its 'queued' --unique mark. On 6.2 XCLAIM …
-- JUSTID keeps it: the renewals keep it too, and the handler's outcome is written as any.
-- Returns how many were kept.
local stream, group, me = KEYS[1], ARGV[1], ARGV[2]
local n = tonumber(ARGV[4])
local kept, deleted, known, uniques = 0, {}, {}, {}
for i = 5, 4 + n do
  local id, job, mark = ARGV[i], ARGV[i + n], tonumber(ARGV[i + 2 * n])
  local p = redis.call('XPENDING', stream, group, id, id, 1)
  if #p == 1 and p[1][2] == me then
    local count = math.max(tonumber(p[1][4]) - 1, 1)
    if #redis.call('XCLAIM', stream, group, me, '0', id, 'RETRYCOUNT', count, 'JUSTID') == 1 then
      kept = kept + 1
    else -- deleted: taken out of the group by this XCLAIM (above)
      deleted[#deleted + 1] = id
      if job and job ~= '' then known[stream .. '|' .. id] = job end
      if mark and mark > 0 then uniques[stream .. '|' .. id] = KEYS[mark] end
    end
  end
end
if #deleted > 0 then
  local h = history_at(2, ARGV[3])
  lost_held(h, workflow_at(6, h.queue), taken_at(8), stream, deleted, known, me,
    marks_of(KEYS[9]), uniques)
end
return kept
