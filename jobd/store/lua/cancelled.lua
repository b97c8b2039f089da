--! uses jobs.lua workflows.lua
-- cancelled.lua: of the entries a reader just read, acknowledge unrun those cancelled.
--
-- KEYS[1]   the stream
-- KEYS[2]   the queue's cancellation marks (see cancel.lua)
-- KEYS[3]   the queue's counters for this minute (a hash)
-- KEYS[4..7] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- KEYS[8], KEYS[9] the queue's waiters hash and outbox: a job cancelled here tells its batch and
--           the jobs waiting for it (lib/workflows.lua ended)
-- KEYS[10..] the marks of the --unique jobs among them ({S}:job:J), referred to by index
-- ARGV[1]   the consumer group
-- ARGV[2]   this consumer's name
-- ARGV[3]   seconds the counters are kept
-- ARGV[4]   the history's settings (lib/jobs.lua history_at)
-- ARGV[5..] pairs: the id of an entry read (this consumer holds it), the index in KEYS of its
--           job's --unique mark (0: none)
--
-- An entry is cancelled when a mark 'id:STREAM|ENTRY' (held until the entry is settled) or
-- 'job:JOB_ID' (its job id, read from its fields as jobd.job does) has not expired. Such an
-- entry is acknowledged, its marks removed, a --unique job's mark deleted if it still says
-- 'queued' (the job will not run: the id is free again), and 'cancelled' counted. Expired marks
-- are removed on the way, and a few held ones whose entry is gone (lib/jobs.lua sweep_held); a
-- marks key of another type (someone else's) holds no mark, nor does a stream key of another
-- type hold entries, a missing group nothing pending, and a --unique mark of another type says
-- nothing: no call below fails once one was written. Each one acknowledged gets its history record and event (cancelled) in
-- the same step. Returns the ids acknowledged.
local stream, marks, stats, group, me = KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2]
if redis.call('TYPE', marks).ok ~= 'zset' then return {} end
if redis.call('TYPE', stream).ok ~= 'stream' then return {} end
-- No group (deleted since the read): nothing is pending here. Asked before any write, so the
-- XPENDING of each entry below cannot fail once something was written.
local group_there = redis.pcall('XPENDING', stream, group)
if type(group_there) ~= 'table' or group_there.err then return {} end
redis.call('ZREMRANGEBYSCORE', marks, '-inf', now_ms())
sweep_held(marks, group, SWEEP)
if redis.call('ZCARD', marks) == 0 then return {} end
local acked = {}
local h, now = history_at(4, ARGV[4]), now_ms()
local w = nil -- lib/workflows.lua workflow_at, looked at once something is cancelled
for i = 5, #ARGV, 2 do
  local id, unique = ARGV[i], tonumber(ARGV[i + 1])
  local entry = redis.call('XRANGE', stream, id, id)
  local by_id = 'id:' .. stream .. '|' .. id
  local by_job = #entry == 1 and ('job:' .. job_id_of(id, entry[1][2])) or nil
  local marked = redis.call('ZSCORE', marks, by_id)
    or (by_job and redis.call('ZSCORE', marks, by_job))
  if marked then
    local p = redis.call('XPENDING', stream, group, id, id, 1)
    if #p == 1 and p[1][2] == me then
      redis.call('XACK', stream, group, id)
      redis.call('ZREM', marks, by_id)
      if by_job then redis.call('ZREM', marks, by_job) end
      if unique > 0 and says_queued(KEYS[unique]) then
        redis.call('DEL', KEYS[unique])
      end
      acked[#acked + 1] = id
      local job = #entry == 1 and job_id_of(id, entry[1][2]) or id
      not_running(h, job, stream, id) -- a dead daemon's record, when it was reclaimed
      local origin = #entry == 1 and origin_of(entry[1][2]) or nil
      local record = cjson.encode({event = 'cancelled', stream = stream, entry = id,
        consumer = me, detail = 'cancelled before it started', origin = origin})
      local batch, incarnation = nil, nil
      if #entry == 1 then batch, incarnation = batch_in(entry[1][2]) end
      remember(h, linked({event = 'cancelled', job = job, record = record,
        extras = with_origin({'consumer', me}, origin)}, batch, incarnation), now, id)
      w = w or workflow_at(8, h.queue)
      ended(w, job, 'cancelled', batch, incarnation)
    end
  end
end
if #acked > 0 then
  trim_history(h, now)
  add_count(stats, 'cancelled', #acked, ARGV[3])
end
return acked
