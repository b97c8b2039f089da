-- lib/workflows.lua: dependencies (--after) and batches (--batch), docs/workflows.md. The end of
-- a job is told to the jobs waiting for it and to its batch through its queue's outbox: the
-- script that ends it writes a notice for each there, in the same step (``ended``), and daemons
-- move them on (store/workflows.py), each applied once where it goes (unblock.lua, batch.lua).
-- Not a script: scripts.py sends it with each script whose first line names it.

-- What a job's end is, by the event of its record: done, failed or cancelled (nil: no end).
local ENDS = {done = 'done', deduped = 'done', ['dead-lettered'] = 'failed', expired = 'failed',
  poison = 'failed', cancelled = 'cancelled'}

-- A queue's waiters hash (job id -> the jobs waiting for it, one JSON line each: wait_on.lua)
-- and outbox, KEYS[k] and KEYS[k + 1]. The hash is looked at once a call: a queue no job waits
-- on pays one EXISTS, not one look a job.
local function workflow_at(k, queue)
  return {waiters = KEYS[k], outbox = KEYS[k + 1], queue = queue, sent = 0,
    watched = redis.call('EXISTS', KEYS[k]) == 1}
end

-- The batch a note names, or nil: store/notes.py note puts it first among the event fields, so
-- that a job of no batch costs one comparison here.
local function batch_of(note)
  if note.extras[1] == 'batch' then return note.extras[2] end
  return nil
end

-- The batch a job's fields (name, value, …) name (jobd_batch), or nil: for the scripts that end a
-- job with no note of its attempt (cancelled unrun: cancelled.lua, cancel_delayed.lua, promote.lua).
local function batch_in(fields)
  for i = 1, #fields - 1, 2 do
    if fields[i] == 'jobd_batch' then return fields[i + 1] end
  end
  return nil
end

-- Job ``job`` of the queue ended as ``event``: a notice for its batch (``batch``, nil: none) and
-- one for each job waiting for it, whose registrations then go (they are told once).
local function ended(w, job, event, batch)
  if not (batch or w.watched) then return end
  local outcome = ENDS[event]
  if not outcome then return end
  local member = w.queue .. ' ' .. job
  if batch and batch ~= '' then
    redis.call('XADD', w.outbox, '*', 'kind', 'batch', 'batch', batch, 'member', member,
      'outcome', outcome, 'event', event)
    w.sent = w.sent + 1
  end
  if not w.watched then return end
  local waiters = redis.call('HGET', w.waiters, job)
  if not waiters then return end
  redis.call('HDEL', w.waiters, job)
  for line in string.gmatch(waiters, '[^\n]+') do
    redis.call('XADD', w.outbox, '*', 'kind', 'release', 'dep', member, 'outcome', outcome,
      'event', event, 'waiter', line)
    w.sent = w.sent + 1
  end
end

-- A held job (hold.lua) and its keys: KEYS[k..k + 2] the queue's held hash, after hash and
-- held:until set, ``job`` its id. Its fields (name, value, …) and batch, or nil when it is not
-- held (released, dead-lettered or cancelled already).
local function held_at(k, job)
  local packed = redis.call('HGET', KEYS[k], job)
  if not packed then return nil end
  local held = cmsgpack.unpack(packed)
  local fields, batch, unique = {}, nil, false
  for i = 3, #held, 2 do
    fields[#fields + 1] = held[i]; fields[#fields + 1] = held[i + 1]
    if held[i] == 'jobd_batch' then batch = held[i + 1] end
    if held[i] == 'jobd_unique' then unique = true end
  end
  return {held = KEYS[k], after = KEYS[k + 1], deadlines = KEYS[k + 2], job = job, due = held[1],
    member = held[2], fields = fields, batch = batch, unique = unique}
end

-- Held job ``j`` ended where it waits (dead-lettered, cancelled): a --unique one's mark
-- ``mark`` (hold.lua took it) goes while it says 'queued', as dead_letter.lua's does, else its
-- job id would be refused for days. (pcall: a key of another type is someone else's.)
local function unmark(j, mark)
  if j.unique and mark and says_queued(mark) then redis.call('DEL', mark) end
end

-- Held job ``j`` (held_at) is held no more.
local function unhold(j)
  redis.call('HDEL', j.held, j.job)
  redis.call('HDEL', j.after, j.job)
  redis.call('ZREM', j.deadlines, j.job)
end

-- Held job ``j`` dead-lettered with jobd_error=dependency (``why`` its jobd_stderr; ``extras``
-- its event's fields), in queue history ``h``: its record on ``dead`` (MAXLEN ``maxlen``), the
-- queue's counters ``stats`` (kept ``ttl`` s), its end told on through ``w``, and the queue's
-- on_dead_letter job ``hook_job`` enqueued by ``hook`` (lib/chains.lua held_hook_at: nil for
-- none; the script then uses chains.lua too), as dead_letter.lua's; ``mark`` its job id's
-- mark (``unmark``).
local function held_dead(j, h, w, now, why, extras, dead, maxlen, stats, ttl, hook, hook_job,
    mark)
  local fields = {}
  for _, v in ipairs(j.fields) do fields[#fields + 1] = v end
  for _, v in ipairs({'jobd_job_id', j.job, 'jobd_queue', h.queue, 'jobd_original_id', '',
      'jobd_error', 'dependency', 'jobd_exit_code', '', 'jobd_signal', '', 'jobd_attempts', '0',
      'jobd_stderr', why}) do
    fields[#fields + 1] = v
  end
  local blocked = hook and dead_letter_hook_blocked(hook)
  if blocked then
    fields[#fields + 1] = 'jobd_on_dead_letter'; fields[#fields + 1] = blocked
  end
  local record = {dead, 'MAXLEN', maxlen, '*'}
  for _, v in ipairs(fields) do record[#record + 1] = v end
  record[#record + 1] = 'jobd_failed_at'; record[#record + 1] = string.format('%d', now)
  local record_id = redis.call('XADD', unpack(record))
  if hook and not blocked then held_hook(hook, hook_job, j, h, fields, record_id, now) end
  unhold(j)
  unmark(j, mark)
  local ex = {'error', 'dependency'}
  for _, v in ipairs(extras) do ex[#ex + 1] = v end
  remember(h, {event = 'dead-lettered', job = j.job, extras = ex,
    record = cjson.encode({event = 'dead-lettered', error = 'dependency', detail = why})}, now, nil)
  add_count(stats, 'dead', 1, ttl)
  add_count(stats, 'failed', 1, ttl)
  ended(w, j.job, 'dead-lettered', j.batch)
end
