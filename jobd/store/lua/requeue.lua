--! uses jobs.lua
-- requeue.lua: move dead-lettered jobs back to their queue's stream, attempts reset.
--
-- KEYS[1]   the dead-letter stream
-- KEYS[2]   the queue's stream
-- KEYS[3..6] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- KEYS[7]   the queue's cancellation marks (cancel.lua)
-- ARGV[1]   milliseconds a mark set again lasts (keys.UNIQUE_TTL)
-- ARGV[2]   the history's settings (lib/jobs.lua history_at)
-- ARGV[3]   who requeues (user@host)
-- ARGV[4]   the prefix of the queue's job id marks (jobd/store/keys.py, "job:J"): a --unique
--           job's mark is prefix .. J, in KEYS[1]'s slot (the queue's hash tag)
-- ARGV[5]   at most this many records visited in this call
-- ARGV[6]   and no record visited once those visited hold this many bytes (one at least;
--           each field counted FIELD_COST more: 100 000 empty fields cost as 6 MiB)
-- ARGV[7]   'ids': ARGV[8…] are record ids; or 'range': ARGV[8] where to start (an id, '(' ..
--           id: after it, or '-'), ARGV[9] the last id ('+': the newest record now)
--
-- Records are read here, one at a time, by id (XRANGE id id) or in order: no record leaves
-- Redis, and the caller sends ids alone, whatever the records' size.
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
-- it had), or whose values it clipped (jobd_clipped). Returns {{ids requeued}, {id, why, …} of
-- the records left, how many ids (or records of the range) were visited, 1 when there may be
-- more to visit (ids left, or the range not walked to its end: go on after the last id
-- visited) else 0, the last id visited (false: none), the range's last id (false: the stream
-- is empty)}; missing ids are skipped (an id that is no stream id too). Each job requeued is in
-- the queue's events (requeue, by, new_entry) and its history (requeued) in the same step. A
-- requeue is an operator's new decision: a `jobd cancel` mark of the job id ('job:JOB_ID',
-- left by a cancel that found the job nowhere) is removed, so that it does not cancel the job
-- requeued.
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

local FIELD_COST = 64 -- jobd.store.browse.FIELD_COST: what a field costs besides its bytes

-- Requeue record ``rec`` ({id, fields}) or leave it in place; returns its size in bytes.
local function requeue(rec)
  local id, fields = rec[1], rec[2]
  local size = #id
  for j = 1, #fields, 2 do size = size + #fields[j] + #fields[j + 1] + FIELD_COST end
  local entry, unique, why = entry_of(fields)
  if not entry then
    left[#left + 1] = id
    left[#left + 1] = why
    return size
  end
  local new = redis.call('XADD', unpack(entry))
  redis.call('XDEL', dead, id)
  local job = id
  for j = 1, #fields, 2 do
    if fields[j] == 'jobd_job_id' then job = fields[j + 1] end
  end
  local record = cjson.encode({event = 'requeued', by = ARGV[3], new_entry = new,
    dead_letter = id, stream = stream})
  -- The batch it leaves (a requeued job is a member no more: jobd_batch is not KEPT), named in
  -- its record and event as the batch of the dead letter (lib/jobs.lua linked).
  remember(h, linked({event = 'requeue', job = job, record = record,
    extras = {'by', ARGV[3], 'new_entry', new, 'dead_letter', id}}, batch_in(fields)), now, nil)
  -- The job id as the daemon reads it from the new entry (jobd.job: a stream id when none).
  local job_id = job_id_of(new, {unpack(entry, 3)})
  if marks then redis.call('ZREM', marks, 'job:' .. job_id) end
  if unique and job_id ~= new then
    redis.call('SET', ARGV[4] .. job_id, 'queued', 'PX', ttl, 'NX')
  end
  done[#done + 1] = id
  return size
end

local most, budget, read, visited, last = tonumber(ARGV[5]), tonumber(ARGV[6]), 0, 0, false
if ARGV[7] == 'ids' then
  for i = 8, #ARGV do
    if visited >= most or read >= budget then break end
    visited = visited + 1
    local rec = redis.pcall('XRANGE', dead, ARGV[i], ARGV[i], 'COUNT', 1)
    if type(rec) == 'table' and not rec.err and rec[1] then
      read = read + requeue(rec[1])
      last = rec[1][1]
    end
  end
  trim_history(h, now)
  return {done, left, visited, 8 + visited <= #ARGV and 1 or 0, last, false}
end
local from, upto = ARGV[8], ARGV[9]
if upto == '+' then
  local newest = redis.call('XREVRANGE', dead, '+', '-', 'COUNT', 1)[1]
  if not newest then return {done, left, 0, 0, false, false} end
  upto = newest[1]
end
local more = 0
while true do
  if visited >= most or read >= budget then
    more = 1
    break
  end
  local rec = redis.call('XRANGE', dead, from, upto, 'COUNT', 1)[1]
  if not rec then break end
  visited = visited + 1
  read = read + requeue(rec)
  last = rec[1]
  from = '(' .. last
end
trim_history(h, now)
return {done, left, visited, more, last, upto}
