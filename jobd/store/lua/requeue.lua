--! uses jobs.lua
-- requeue.lua: move dead-lettered jobs back to their queue's stream, attempts reset.
--
-- KEYS[1]   the dead-letter stream
-- KEYS[2]   the queue's stream
-- KEYS[3..6] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- KEYS[7]   the queue's cancellation marks (cancel.lua)
-- KEYS[8..] the job id marks of the records' --unique jobs (jobd/store/keys.py, "job:J")
-- ARGV[1]   milliseconds a mark set again lasts (keys.UNIQUE_TTL)
-- ARGV[2]   the history's settings (lib/jobs.lua history_at)
-- ARGV[3]   who requeues (user@host)
-- ARGV[4..] pairs: a dead-letter record's id, the index in KEYS of its job's mark or 0
--
-- Each record's job goes back as a new entry: its own fields plus jobd_job_id (kept, so the
-- job id stays stable) and jobd_unique (kept, so a --unique job stays unique: its mark, which
-- dead_letter.lua deleted, is set to 'queued' again unless the job id has one), the producer's
-- jobd_timeout and jobd_max_attempts (kept: the job's own limits), and no jobd_attempt (so
-- attempts start again at 1) and no jobd_expires_at (a requeue is an operator's "run it now":
-- an expired job would only expire again); the record is deleted in the same script.
-- Others may XADD records too: one whose entry could not be added (no job fields of its own,
-- or more than MAX_FIELDS fields) is left in place, and so is the record of a job wider than
-- that (dead_letter.lua keeps only its payload and job_id, and says in jobd_fields how many
-- it had), or whose values it clipped (jobd_clipped). Returns {{ids requeued}, {id, why, …} of the records left}; missing ids are
-- skipped. Each job requeued is in the queue's events (requeue, by, new_entry) and its
-- history (requeued) in the same step. A requeue is an operator's new decision: a `jobd
-- cancel` mark of the job id ('job:JOB_ID', left by a cancel that found the job nowhere) is
-- removed, so that it does not cancel the job requeued.
local dead, stream, ttl = KEYS[1], KEYS[2], ARGV[1]
local KEPT = {jobd_job_id = true, jobd_unique = true, jobd_parent = true, jobd_timeout = true,
  jobd_max_attempts = true}

-- The XADD arguments of a record's job and whether it is unique, else nil, false and why not.
local function entry_of(fields)
  local entry, own, unique, width = {stream, '*'}, 0, false, nil
  local function add(j)
    entry[#entry + 1] = fields[j]
    entry[#entry + 1] = fields[j + 1]
  end
  for j = 1, #fields, 2 do
    if string.sub(fields[j], 1, 5) ~= 'jobd_' then
      own = own + 1
      add(j)
    end
  end
  for j = 1, #fields, 2 do
    if KEPT[fields[j]] then
      add(j)
      unique = unique or fields[j] == 'jobd_unique'
    elseif fields[j] == 'jobd_fields' then
      width = fields[j + 1]
    elseif fields[j] == 'jobd_clipped' then
      return nil, false, 'clipped: ' .. fields[j + 1] .. ' bytes, only a prefix kept (malformed)'
    end
  end
  if width then
    return nil, false, string.format('truncated: the job had %s fields, more than %d',
      width, MAX_FIELDS)
  end
  if own == 0 then return nil, false, 'no job fields (only jobd_* ones)' end
  if (#entry - 2) / 2 > MAX_FIELDS then
    return nil, false, string.format('more than %d fields (jobd.job.MAX_FIELDS)', MAX_FIELDS)
  end
  return entry, unique
end

local done, left = {}, {}
local h, now = history_at(3, ARGV[2]), now_ms()
local marks = redis.call('TYPE', KEYS[7]).ok == 'zset' and KEYS[7] or nil
for i = 4, #ARGV, 2 do
  local id, mark = ARGV[i], tonumber(ARGV[i + 1])
  local rec = redis.call('XRANGE', dead, id, id)
  if #rec == 1 then
    local entry, unique, why = entry_of(rec[1][2])
    if entry then
      local new = redis.call('XADD', unpack(entry))
      redis.call('XDEL', dead, id)
      local fields, job = rec[1][2], id
      for j = 1, #fields, 2 do
        if fields[j] == 'jobd_job_id' then job = fields[j + 1] end
      end
      local record = cjson.encode({event = 'requeued', by = ARGV[3], new_entry = new,
        dead_letter = id, stream = stream})
      remember(h, {event = 'requeue', job = job, record = record,
        extras = {'by', ARGV[3], 'new_entry', new, 'dead_letter', id}}, now, nil)
      if marks then
        redis.call('ZREM', marks, 'job:' .. job_id_of(new, {unpack(entry, 3)}))
      end
      if unique and mark > 0 then
        redis.call('SET', KEYS[mark], 'queued', 'PX', ttl, 'NX')
      end
      done[#done + 1] = id
    else
      left[#left + 1] = id
      left[#left + 1] = why
    end
  end
end
trim_history(h, now)
return {done, left}
