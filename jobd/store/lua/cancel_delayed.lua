--! uses jobs.lua workflows.lua
-- cancel_delayed.lua: remove cancelled jobs from a delayed set, one page of it per call.
--
-- KEYS[1]   the delayed set
-- KEYS[2]   the queue's counters for this minute (a hash)
-- KEYS[3]   the queue's cancellation marks (cancel.lua): a removed job's 'job:' mark goes too
-- KEYS[4..7] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- KEYS[8], KEYS[9] the queue's waiters hash and outbox: a job removed tells its batch and the
--           jobs waiting for it (lib/workflows.lua ended)
-- KEYS[10..] the --unique marks of the job ids ({S}:job:J), in the order of ARGV[6..]
-- ARGV[1]   where the page starts, counted from the set's end (0: the last member)
-- ARGV[2]   how many members the page holds at most
-- ARGV[3]   seconds the counters are kept
-- ARGV[4]   the history's settings (lib/jobs.lua history_at)
-- ARGV[5]   who cancels them (user@host)
-- ARGV[6..] job ids
--
-- A member is a job of one of the ids when its job_id or jobd_job_id field is one (a member that
-- is not a job is left to promote.lua). A removed job's --unique mark is deleted if it still
-- says 'queued'. The walk goes from the latest due to the soonest: promote.lua removes the
-- soonest, which moves no member's rank counted from the end, so a walk of many calls skips
-- nothing it removes. Each job removed gets its history record and event (cancelled, by) in the
-- same step (its due time, unless its score is no time: browse.score_ms). Returns {the next
-- page's start, or -1 at the end, {job id, due (ms) as Redis writes it}, …}.
local start, size = tonumber(ARGV[1]), tonumber(ARGV[2])
local mark_of = {}
for i = 6, #ARGV do mark_of[ARGV[i]] = KEYS[i + 4] end
local h, now = history_at(4, ARGV[4]), now_ms()
local marks = redis.call('TYPE', KEYS[3]).ok == 'zset' and KEYS[3] or nil
local page = redis.call('ZRANGE', KEYS[1], -(start + size), -(start + 1), 'WITHSCORES')
local removed, w = {}, nil
for i = 1, #page, 2 do
  local job = decode_member(page[i])
  if job then
    local fields = {}
    for j = 2, #job do fields[#fields + 1] = job[j] end
    local jid = job_id_of('', fields)
    if jid ~= '' and mark_of[jid] then
      redis.call('ZREM', KEYS[1], page[i])
      if says_queued(mark_of[jid]) then redis.call('DEL', mark_of[jid]) end
      if marks then redis.call('ZREM', marks, 'job:' .. jid) end
      removed[#removed + 1] = {jid, page[i + 1]}
      local due = tonumber(page[i + 1])  -- a score that is no time (±inf: anyone's ZADD) is
      local said = math.abs(due) <= 8640000000000000 and {'due', due} or {}  -- not said: no date
      local origin = origin_of(fields)
      local record = cjson.encode({event = 'cancelled', by = ARGV[5],
        detail = 'removed from the delayed set, unrun', origin = origin})
      local batch, incarnation = batch_in(fields)
      remember(h, linked({event = 'cancelled', job = jid, record = record,
        extras = with_origin({'by', ARGV[5]}, origin)}, batch, incarnation), now, nil,
        said)
      w = w or workflow_at(8, h.queue)
      ended(w, jid, 'cancelled', batch, incarnation)
    end
  end
end
if #removed > 0 then
  trim_history(h, now)
  add_count(KEYS[2], 'cancelled', #removed, ARGV[3])
end
local after = (#page / 2 < size) and -1 or (start + size - #removed)
return {after, removed}
