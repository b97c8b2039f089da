--! uses jobs.lua workflows.lua
-- settle.lua: acknowledge entries, or hand them back, but only those this consumer still holds;
-- each one's history record and event are written in the same step (lib/jobs.lua remember).
--
-- KEYS[1]   the queue's stream
-- KEYS[2]   the queue's counters for this minute (a hash; see jobd/store/keys.py)
-- KEYS[3]   the queue's cancellation marks (cancel.lua)
-- KEYS[4..7] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- KEYS[8..] the job id marks of the jobs that keep one (jobd/store/keys.py, "job:J"), referred to
--           by index from ARGV (for 'back', a --unique job's only: deleted should it end 'lost')
-- ARGV[1]   the consumer group
-- ARGV[2]   this consumer's name
-- ARGV[3]   seconds the counters are kept
-- ARGV[4]   milliseconds an acked job's mark says 'done' (the dedupe window); 0: deleted
-- ARGV[5]   the history's settings (lib/jobs.lua history_at)
-- ARGV[6]   index in KEYS of the queue's outbox (on a Redis Cluster), or 0: follow-ups are added
--           to their queues here (one Redis: their streams and delayed sets are among KEYS)
-- ARGV[7..] per entry: operation, id, index in KEYS of the job's mark (0: none), for 'back'
--           sent again the milliseconds since it was first sent (-1: the first send; see below),
--           then its note (lib/jobs.lua note_at), then its follow-ups (lib/jobs.lua
--           follow_ups_at; a count of 0 for most). Operation 'ack': XACK, and the mark set to
--           'done' or deleted in the same step, and the job's follow-ups added to their queues
--           (or to the outbox, each an entry whose fields say where it goes: store/outbox.py)
--           before it, with an event 'follow-ups'; a follow-up that cannot be written (someone
--           else's key where it goes) leaves the entry unacknowledged, as not held: nothing of it
--           is written (it is taken over and run again, poison in the end). Operation
--           'back': make the entry reclaimable at once (XCLAIM … TIME 1 JUSTID sets its last
--           delivery to 1970, so it looks idle for decades and any consumer's XAUTOCLAIM takes
--           it now), its delivery count one less: see below; an entry deleted meanwhile (no
--           data: XRANGE) is acked instead, and its job ends 'lost' here (lib/workflows.lua
--           lost_job, its cancellation marks and --unique mark removed) rather than handed
--           back: on Redis 6.2 as on 7.0+ (whose XCLAIM would purge it; 6.2's keeps it pending,
--           to end 'lost' in a reclaim that knows no mark: review 35z). Operation 'cancel' (`jobd
--           cancel` stopped it): XACK, counted as cancelled, its cancellation marks removed, and
--           a --unique job's mark deleted if it still says 'queued'.
-- KEYS[#KEYS - 2], KEYS[#KEYS - 1] the queue's waiters hash and outbox: a job that ends here
--           (done, cancelled) tells its batch and the jobs waiting for it (lib/workflows.lua
--           ended)
-- KEYS[#KEYS] the queue's taken hash: a workflow job's record goes with its end (lib/workflows.lua
--           untake)
--
-- Returns a flat list of pairs for the entries left alone: id, owner now ('' when no one); and
-- last the pair '', 'notices' when workflow notices were written into the outbox.
-- An entry another consumer took over is being run there: acknowledging or handing it back
-- from here would end or duplicate that run, and it gets no record from here. A replay (a lost
-- reply) finds its entries no longer pending: nothing is written twice.
local stream, stats, group, me = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local window = tonumber(ARGV[4])
local h, now = history_at(4, ARGV[5]), now_ms()
local w, taken = workflow_at(#KEYS - 2, h.queue), taken_at(#KEYS)
local skipped, done, cancelled = {}, 0, 0
-- While cancellation marks exist, a job that ends here (done, or cancelled) takes its marks
-- with it: a later job of the same id is not cancelled by a mark meant for this one.
local marks = KEYS[3] and redis.call('TYPE', KEYS[3]).ok == 'zset' and KEYS[3] or nil
local function unmark(id, job)
  redis.call('ZREM', marks, 'id:' .. stream .. '|' .. id, 'job:' .. job)
end
local outbox = tonumber(ARGV[6]) > 0 and KEYS[tonumber(ARGV[6])] or nil
-- The follow-ups ``fu`` of entry ``id`` of job ``job``, written (true), or none of them when one
-- cannot be (false).
local function follow(id, job, fu)
  if outbox then
    local t = redis.call('TYPE', outbox).ok
    if t ~= 'stream' and t ~= 'none' then return false end
  else
    for _, f in ipairs(fu) do
      if not can_add(f.stream, f.delayed) then return false end
    end
  end
  local queues, seen = {}, {}
  for _, f in ipairs(fu) do
    if outbox then
      redis.call('XADD', outbox, '*', 'queue', f.queue, 'stream', f.stream, 'delayed', f.delayed,
        'mark', f.mark, 'due', f.due, 'member', f.member, 'job', f.job,
        'fields', cmsgpack.pack(f.fields))
    else
      add_job(f.stream, f.delayed, f.due, f.member, f.fields)
    end
    if not seen[f.queue] then seen[f.queue] = true; queues[#queues + 1] = f.queue end
  end
  emit(h, 'follow-ups', {'job', job, 'entry', id, 'count', string.format('%d', #fu),
    'queues', table.concat(queues, ',')})
  return true
end
local i = 7
while i <= #ARGV do
  local op, id, mark, again = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  local note, fu
  note, i = note_at(i + 4)
  fu, i = follow_ups_at(i)
  local p = redis.call('XPENDING', stream, group, id, id, 1)
  if #p == 0 or p[1][2] ~= me or (op == 'ack' and #fu > 0 and not follow(id, note.job, fu)) then
    skipped[#skipped + 1] = id
    skipped[#skipped + 1] = (#p == 0) and '' or p[1][2]
  elseif op == 'ack' then
    if marks then unmark(id, note.job) end
    local acked = redis.call('XACK', stream, group, id)
    if acked == 1 then
      not_running(h, note.job, stream, id)
      remember(h, note, now, id)
      untake(taken, w, stream, id, batch_of(note), mark > 0)
      ended(w, note.job, 'done', batch_of(note))
    end
    done = done + acked
    if acked == 1 and mark > 0 then
      if window > 0 then
        redis.call('SET', KEYS[mark], 'done', 'PX', window)
      else
        redis.call('DEL', KEYS[mark])
      end
    end
  elseif op == 'cancel' then
    if marks then unmark(id, note.job) end
    local acked = redis.call('XACK', stream, group, id)
    cancelled = cancelled + acked
    if acked == 1 then
      not_running(h, note.job, stream, id)
      remember(h, note, now, id)
      untake(taken, w, stream, id, batch_of(note), mark > 0)
      ended(w, note.job, 'cancelled', batch_of(note))
    end
    if mark > 0 and says_queued(KEYS[mark]) then
      redis.call('DEL', KEYS[mark])
    end
  elseif again >= 0 and tonumber(p[1][3]) <= again + 1 then
    -- A hand-back sent again (its reply, or its connection, was lost) to an entry delivered
    -- since it was first sent: claimed again, by this very consumer too, and maybe running.
    -- That delivery is not this hand-back's: left alone (1 ms for the two clocks' rounding).
    -- An entry no one took since is idle longer than that, and handed back now.
  elseif tonumber(p[1][3]) < HANDED_BACK then
    -- A hand-back ends this delivery with an outcome: it must not count toward poison
    -- (max_deliveries), and the next consumer's XAUTOCLAIM counts one; so one less here.
    -- Once only: an entry idle for decades was handed back already (this call is a replay
    -- after a lost reply), and must not lose a second delivery.
    not_running(h, note.job, stream, id)
    if #redis.call('XRANGE', stream, id, id) == 0 then -- its entry was deleted: nothing to hand
      redis.call('XACK', stream, group, id)
      local batch, incarnation = batch_of(note)
      untake(taken, w, stream, id, batch, mark > 0)
      lost_job(h, w, stream, id, note.job, batch, incarnation, me, now, marks,
        mark > 0 and KEYS[mark] or nil)
    else
      local count = math.max(tonumber(p[1][4]) - 1, 0)
      redis.call('XCLAIM', stream, group, me, '0', id, 'TIME', '1', 'RETRYCOUNT', count, 'JUSTID')
      remember(h, note, now, id)
    end
  end
end
trim_history(h, now)
if done > 0 then
  add_count(stats, 'done', done, ARGV[3])
end
if cancelled > 0 then
  add_count(stats, 'cancelled', cancelled, ARGV[3])
end
if w.sent > 0 then
  skipped[#skipped + 1] = ''
  skipped[#skipped + 1] = 'notices'
end
return skipped
