-- lib/workflows.lua: dependencies (--after) and batches (--batch), docs/workflows.md. The end of
-- a job is told to the jobs waiting for it and to its batch through its queue's outbox: the
-- script that ends it writes a notice for each there, in the same step (``ended``), and daemons
-- move them on (store/workflows.py), each applied once where it goes (unblock.lua, batch.lua).
-- Not a script: scripts.py sends it with each script whose first line names it.

-- What a job's end is, by the event of its record: done, failed or cancelled (nil: no end).
-- 'lost': its entry was deleted (XDEL, XADD MAXLEN, XTRIM) while a daemon held it (``lost_end``).
local ENDS = {done = 'done', deduped = 'done', ['dead-lettered'] = 'failed', expired = 'failed',
  poison = 'failed', cancelled = 'cancelled', lost = 'failed'}

-- A queue's waiters hash (job id -> the jobs waiting for it, one field each: ``add_waiter``)
-- and outbox, KEYS[k] and KEYS[k + 1]. The hash is looked at once a call: a queue no job waits
-- on pays one TYPE, not one look a job. A key of another type at either (someone else's) is
-- never read nor written, as its type is known before the script's first write: a waiters key
-- that is no hash holds no waiters; an outbox that is no stream takes no notice (``ended``
-- tells nothing: the outbox's duty fails on it, logged, every pass), and the end goes on whole.
local function workflow_at(k, queue)
  return {waiters = KEYS[k], outbox = KEYS[k + 1], queue = queue, sent = 0,
    watched = redis.call('TYPE', KEYS[k]).ok == 'hash'}
end

-- Whether ``w``'s outbox takes notices (a stream, or no key yet): looked at once a call, when
-- a notice is first to be written.
local function writable(w)
  if w.writable == nil then
    local t = redis.call('TYPE', w.outbox).ok
    w.writable = t == 'stream' or t == 'none'
  end
  return w.writable
end

-- The batch a note names, or nil, and which batch of that id (its incarnation: the member's
-- jobd_batch_incarnation, lib/jobs.lua note_at; nil from a jobd before review 35n, or ''): two
-- values, for ``ended``. store/notes.py note puts the batch first among the event fields, so
-- that a job of no batch costs one comparison here.
local function batch_of(note)
  if note.extras[1] == 'batch' then return note.extras[2], note.incarnation end
  return nil
end

-- A job's waiters, in its queue's waiters hash ``key`` (known to be a hash), under fields named
-- from its job id ``job`` (no job id holds a NUL byte), one waiter a field, so that registering
-- one (``add_waiter``), taking one off (unwait.lua) and telling one (``ended``) each cost the
-- same whatever the number of others:
--   JOB\0n                  "HIGH LIVE": the last slot number given, how many waiters are left
--   JOB\0SLOT               (SLOT 1..HIGH) the waiter's name there: TOKEN\0HOLDER
--   JOB\0hTOKEN\0HOLDER     "SLOT\nLINE": the waiter line (store/workflows.py waiter_line) of
--                           hold TOKEN of job HOLDER; its existence is the dedupe
-- The slots stay 1..LIVE (HIGH = LIVE): a waiter taken off has the last slot's moved into its
-- own, so that the end of a job walks the waiters it has, not every one it ever had (review
-- 35m: one waiter staying while others came and went made HIGH grow without bound). The last
-- one taken off deletes JOB\0n.
local function waiter_index(job, name) return job .. '\0h' .. name end

local function waiter_count(key, job)
  local high, live = string.match(redis.call('HGET', key, job .. '\0n') or '', '^(%d+) (%d+)$')
  return tonumber(high) or 0, tonumber(live) or 0
end

-- Register ``line``, the waiter line of hold ``token`` of job ``holder``, with job ``job``:
-- once however often sent. Whether it was registered now.
local function add_waiter(key, job, holder, token, line)
  local name = token .. '\0' .. holder
  local index = waiter_index(job, name)
  if redis.call('HEXISTS', key, index) == 1 then return false end
  local high, live = waiter_count(key, job)
  high = high + 1
  redis.call('HSET', key, job .. '\0n', high .. ' ' .. (live + 1), job .. '\0' .. high, name,
    index, high .. '\n' .. line)
  return true
end

-- Slot ``slot`` of ``job`` freed: the waiter of its last slot ``high`` moves into it (its name
-- there, its index's slot number rewritten); the new HIGH.
local function fill_slot(key, job, slot, high)
  local last = job .. '\0' .. high
  if slot == high then
    redis.call('HDEL', key, last)
    return high - 1
  end
  local moved = redis.call('HGET', key, last)
  local mi = moved and waiter_index(job, moved)
  local mv = mi and redis.call('HGET', key, mi)
  local cut = mv and string.find(mv, '\n', 1, true)
  if not cut then -- no waiter there (a hash someone wrote): the freed slot stays empty
    redis.call('HDEL', key, job .. '\0' .. slot)
    return high
  end
  redis.call('HSET', key, job .. '\0' .. slot, moved, mi, slot .. string.sub(mv, cut))
  redis.call('HDEL', key, last)
  return high - 1
end

-- Take the registration of hold ``token`` of job ``holder`` off job ``job``: 1 when it was
-- there, else 0.
local function drop_waiter(key, job, holder, token)
  local index = waiter_index(job, token .. '\0' .. holder)
  local v = redis.call('HGET', key, index)
  if not v then return 0 end
  local slot = tonumber(string.match(v, '^(%d+)\n'))
  local high, live = waiter_count(key, job)
  redis.call('HDEL', key, index)
  if live <= 1 then
    redis.call('HDEL', key, job .. '\0n')
    if slot then redis.call('HDEL', key, job .. '\0' .. slot) end
    return 1
  end
  if slot and slot <= high then high = fill_slot(key, job, slot, high) end
  redis.call('HSET', key, job .. '\0n', high .. ' ' .. (live - 1))
  return 1
end

-- Waiters registered by a jobd before review 35k (every waiter of ``job`` a line of one field,
-- JOB, rewritten whole per registration; the holds unwait.lua marked gone in JOB\0gone)
-- are moved into fields of their own, the lines marked gone left out: once, by the first
-- script of this jobd that registers, takes off or tells a waiter of ``job``. A line that is
-- no waiter line (none jobd wrote) is kept, named by itself, and told as before.
local function upgrade_waiters(key, job)
  local old = redis.call('HGET', key, job)
  if not old then return end
  local marks = redis.call('HGET', key, job .. '\0gone')
  redis.call('HDEL', key, job, job .. '\0gone')
  local gone = {}
  for t in string.gmatch(marks or '', '\n(%x+)') do gone[t] = true end
  for line in string.gmatch(old, '[^\n]+') do
    local ok, w = pcall(cjson.decode, line)
    if ok and type(w) == 'table' and type(w.job) == 'string' then
      local token = type(w.hold) == 'string' and w.hold or ''
      if not gone[token] then add_waiter(key, job, w.job, token, line) end
    else
      add_waiter(key, job, line, '', line)
    end
  end
end

local MISSES_MAX = 64

-- Job ``job`` of the queue ended as ``event``: a notice for its batch (``batch``, nil: none; of
-- its ``incarnation``, when known: batch.lua counts it in that batch of the id only) and one
-- for each job waiting for it, whose registrations then go (they are told once).
local function ended(w, job, event, batch, incarnation)
  if not (batch or w.watched) then return end
  local outcome = ENDS[event]
  if not outcome or not writable(w) then return end
  local member = w.queue .. ' ' .. job
  if batch and batch ~= '' then
    local notice = {w.outbox, '*', 'kind', 'batch', 'batch', batch, 'member', member,
      'outcome', outcome, 'event', event}
    if incarnation and incarnation ~= '' then
      notice[#notice + 1] = 'incarnation'; notice[#notice + 1] = incarnation
    end
    redis.call('XADD', unpack(notice))
    w.sent = w.sent + 1
  end
  if not w.watched then return end
  upgrade_waiters(w.waiters, job)
  local high, live = waiter_count(w.waiters, job)
  if high == 0 then return end
  redis.call('HDEL', w.waiters, job .. '\0n')
  -- Slots 1..LIVE (fill_slot keeps them so): walked until LIVE waiters were found, or past
  -- MISSES_MAX empty slots (a JOB\0n someone wrote, "9999999999 1", costs that many reads).
  local found, missed = 0, 0
  for slot = 1, high do
    if found >= live or missed > MISSES_MAX then break end
    local at = job .. '\0' .. slot
    local name = redis.call('HGET', w.waiters, at)
    if not name then missed = missed + 1 end
    if name then
      found = found + 1
      local index = waiter_index(job, name)
      local v = redis.call('HGET', w.waiters, index) or ''
      redis.call('HDEL', w.waiters, at, index)
      local cut = string.find(v, '\n', 1, true)
      if cut then
        redis.call('XADD', w.outbox, '*', 'kind', 'release', 'dep', member, 'outcome', outcome,
          'event', event, 'waiter', string.sub(v, cut + 1))
        w.sent = w.sent + 1
      end
    end
  end
end

-- A held job (hold.lua) and its keys: KEYS[k..k + 2] the queue's held hash, after hash and
-- held:until set, ``job`` its id. Its fields (name, value, …) and batch, or nil when it is not
-- held (released, dead-lettered or cancelled already).
local function held_at(k, job)
  local packed = redis.call('HGET', KEYS[k], job)
  if not packed then return nil end
  local held = cmsgpack.unpack(packed)
  local fields, unique = {}, false
  for i = 3, #held, 2 do
    fields[#fields + 1] = held[i]; fields[#fields + 1] = held[i + 1]
    if held[i] == 'jobd_unique' then unique = true end
  end
  local batch, incarnation = batch_in(fields)
  return {held = KEYS[k], after = KEYS[k + 1], deadlines = KEYS[k + 2], job = job, due = held[1],
    member = held[2], fields = fields, batch = batch, incarnation = incarnation, unique = unique}
end

-- Held job ``j`` ended where it waits (dead-lettered, cancelled): a --unique one's mark
-- ``mark`` (hold.lua took it) goes while it says 'queued', as dead_letter.lua's does, else its
-- job id would be refused for days. (pcall: a key of another type is someone else's.)
local function unmark(j, mark)
  if j.unique and mark and says_queued(mark) then redis.call('DEL', mark) end
end

-- A --unique held job's mark (hold.lua takes it) lives while it is held, and from its release
-- as enqueue_unique.lua's does: UNIQUE_TTL_MS after its due time (a delayed one's too).
local UNIQUE_TTL_MS = 604800000 -- jobd.store.keys.UNIQUE_TTL (a test holds them equal)
local function delay_of(due)
  if due == '' then return 0 end
  local now, at = due_time(due)
  return (at and at > now) and (at - now) or 0
end

-- Held job ``j`` released: its mark ``mark`` lives on as enqueue_unique.lua's would.
local function remark(j, mark)
  if j.unique and mark and says_queued(mark) then
    redis.call('PEXPIRE', mark, string.format('%d', UNIQUE_TTL_MS + delay_of(j.due)))
  end
end

-- Held job ``j`` (held_at) ends where it waits (cancelled, dead-lettered): its registrations with
-- the jobs it still waits for (wait_on.lua: their queues' waiters hashes, in other slots) are
-- taken off by notices written through ``w`` into its queue's outbox in this step (before
-- ``unhold``: its after hash names them, and where each lives), moved on as any notice
-- (unwait.lua, in the slot of each); each takes off the line of this hold only (its token,
-- ``j.member``), so that no registration outlives its hold. A hold whose after hash names no
-- waiters keys (held before they were kept there) writes none; nor does the dependency whose
-- end ends it (``j.told``: its registrations went with that end).
local function unregister(w, j)
  local spec = redis.pcall('HGET', j.after, j.job)
  if type(spec) ~= 'string' or not writable(w) then return end
  local ok, after = pcall(cjson.decode, spec)
  if not (ok and type(after) == 'table' and type(after.waiters) == 'table'
      and type(after.deps) == 'table') then
    return
  end
  for _, d in ipairs(after.deps) do
    local key, dep = after.waiters[d], type(d) == 'string' and string.match(d, '^[^ ]* (.*)$')
    if type(key) == 'string' and dep and d ~= j.told then
      redis.call('XADD', w.outbox, '*', 'kind', 'unwait', 'waiters', key, 'dep', dep,
        'job', j.job, 'hold', j.member)
      w.sent = w.sent + 1
    end
  end
end

-- Held job ``j`` (held_at) is held no more.
local function unhold(j)
  redis.call('HDEL', j.held, j.job)
  redis.call('HDEL', j.after, j.job)
  redis.call('ZREM', j.deadlines, j.job)
end

-- The expiry of held job ``j`` (its jobd_expires_at, Unix ms), or nil.
local function expiry_of(j)
  for i = 1, #j.fields - 1, 2 do
    if j.fields[i] == 'jobd_expires_at' then return tonumber(j.fields[i + 1]) end
  end
  return nil
end

-- Held job ``j`` dead-lettered with jobd_error=dependency, or ``err`` (expired: its own expiry
-- passed while it waited; its event then 'expired', as a job read past it: dead_letter.lua)
-- (``why`` its jobd_stderr; ``extras``
-- its event's fields, its origin added: a producer waiting for it knows its end by it), in queue history ``h``: its record on ``dead`` (MAXLEN ``maxlen``), the
-- queue's counters ``stats`` (kept ``ttl`` s), its end told on through ``w``, and the queue's
-- on_dead_letter job ``hook_job`` enqueued by ``hook`` (lib/chains.lua held_hook_at: nil for
-- none; the script then uses chains.lua too), as dead_letter.lua's; ``mark`` its job id's
-- mark (``unmark``); ``dep``, ``outcome``: the dependency whose end dead-lettered it and how
-- that ended, written into its record too (`jobd job`'s after.left strikes it off there:
-- store/records.py links), nil for none.
local function held_dead(j, h, w, now, why, extras, dead, maxlen, stats, ttl, hook, hook_job,
    mark, err, dep, outcome)
  err = err or 'dependency'
  local event = err == 'expired' and 'expired' or 'dead-lettered'
  local fields = {}
  for _, v in ipairs(j.fields) do fields[#fields + 1] = v end
  for _, v in ipairs({'jobd_job_id', j.job, 'jobd_queue', h.queue, 'jobd_original_id', '',
      'jobd_error', err, 'jobd_exit_code', '', 'jobd_signal', '', 'jobd_attempts', '0',
      'jobd_stderr', why}) do
    fields[#fields + 1] = v
  end
  local blocked = hook and held_hook_blocked(hook, h.queue, j.job, fields)
  if blocked then
    fields[#fields + 1] = 'jobd_on_dead_letter'; fields[#fields + 1] = blocked
  end
  local record = {dead, 'MAXLEN', maxlen, '*'}
  for _, v in ipairs(fields) do record[#record + 1] = v end
  record[#record + 1] = 'jobd_failed_at'; record[#record + 1] = string.format('%d', now)
  local record_id = redis.call('XADD', unpack(record))
  if hook and not blocked then held_hook(hook, hook_job, j, h, fields, record_id, now) end
  unregister(w, j)
  unhold(j)
  unmark(j, mark)
  local ex, origin = {'error', err}, origin_of(j.fields)
  for _, v in ipairs(extras) do ex[#ex + 1] = v end
  remember(h, linked({event = event, job = j.job, extras = with_origin(ex, origin),
    record = cjson.encode({event = event, error = err, detail = why, origin = origin,
      dependency = dep, outcome = outcome})},
    j.batch, j.incarnation), now, nil)
  add_count(stats, 'dead', 1, ttl)
  add_count(stats, 'failed', 1, ttl)
  ended(w, j.job, event, j.batch, j.incarnation)
end

-- Ended holds (KEYS: the queue's held:ended set, store/keys.py): a job whose hold ended
-- (released into its stream, or dead-lettered) is remembered there, by job id, scored by when
-- it is forgotten (Redis ms: the end plus ``window``, the queue's history.max_age), so that an
-- enqueue sent again (its reply lost, the command run again) does not hold and run it again
-- (hold.lua). A cancel where it waits leaves no entry: the job id is free again. Each write
-- forgets up to ENDED_PRUNE entries past their time, so the set keeps about one window's ends.
-- A key of another type there (someone else's) is neither read nor written: the end goes on.
local ENDED_PRUNE = 100

-- Whether job ``job``'s hold ended within its window, at ``now``.
local function hold_ended_at(key, job, now)
  local until_ms = redis.pcall('ZSCORE', key, job)
  return type(until_ms) == 'string' and tonumber(until_ms) > now
end

-- Job ``job``'s hold ended at ``now``: remembered ``window`` ms.
local function hold_ended(key, job, now, window)
  local t = redis.call('TYPE', key).ok
  if t ~= 'zset' and t ~= 'none' then return end
  local old = redis.call('ZRANGEBYSCORE', key, '-inf', string.format('%d', now), 'LIMIT', 0,
    ENDED_PRUNE)
  if #old > 0 then redis.call('ZREM', key, unpack(old)) end
  redis.call('ZADD', key, string.format('%d', now + window), job)
end


-- Taken workflow entries (the queue's taken hash, store/keys.py): a job whose entry is deleted
-- while a daemon holds it (XDEL, XADD MAXLEN, XTRIM) cannot be read from its entry any more,
-- yet its end must reach its batch and the jobs waiting for it. So the read that takes the
-- entry of such a job (read_levels.lua, reclaim.lua; wait_on.lua for a waiter that comes while
-- it runs) records "STREAM|ENTRY" -> cmsgpack {job id, batch, incarnation[, 1: --unique]}, and
-- the script that finds the entry deleted (``lost_end``) reads it there. Only workflow jobs and
-- --unique jobs are recorded: a jobd_batch, a job id with waiters, or a jobd_unique (whose mark
-- a reclaimer, which never read the entry, frees by its job id: review 35z); other jobs cost
-- nothing (a read asks nothing more of Redis than one TYPE when the queue has waiters). A record is removed by ``lost_end`` and by
-- the step that ends its job while pending (settle.lua, dead_letter.lua: ``untake``); one whose
-- entry was settled otherwise (a retry, a cancel at the read) is swept by a later write
-- (``sweep_taken``: TAKEN_SWEEP records drawn at random, each removed when its entry is pending
-- no more), so the hash holds about the workflow jobs running, never the ones that ran. A key of another type there
-- (someone else's) is neither read nor written (``taken_at``): the jobs are then told as before.
local TAKEN_SWEEP = 2

-- The taken hash KEYS[k], looked at (TYPE) only once a record is to be read or written
-- (``taken_key``): most reads take no workflow job.
local function taken_at(k)
  return {key = KEYS[k]}
end

-- The taken hash ``t`` (``taken_at``), or nil when it is someone else's key.
local function taken_key(t)
  if t.ours == nil then
    local kind = redis.call('TYPE', t.key).ok
    t.ours = kind == 'hash' or kind == 'none'
  end
  return t.ours and t.key or nil
end

-- Whether job ``job`` has waiters in the waiters hash ``key`` (known to be a hash), in either
-- form (``waiter_count``'s; one field JOB before review 35k: ``upgrade_waiters``).
local function waited_for(key, job)
  return redis.call('HEXISTS', key, job .. '\0n') == 1 or redis.call('HEXISTS', key, job) == 1
end

-- TAKEN_SWEEP records of ``taken`` whose entry is pending in ``group`` no more go.
local function sweep_taken(taken, group)
  for _, f in ipairs(redis.call('HRANDFIELD', taken, TAKEN_SWEEP)) do
    local stream, id = string.match(f, '^(.+)|(%d+%-%d+)$')
    local gone = not stream or hash_tag(stream) ~= hash_tag(taken)
    if not gone then
      local p = redis.pcall('XPENDING', stream, group, id, id, 1)
      gone = type(p) == 'table' and not p.err and #p == 0
    end
    if gone then redis.call('HDEL', taken, f) end
  end
end

-- Entry ``id`` of ``stream``, fields ``fields`` (as handed over: a stand-in keeps the job id and
-- batch), was taken by a consumer of ``group``: recorded in the taken hash ``t`` (``taken_at``)
-- when its job is a workflow job (a batch's, or waited for in ``waiters``: a hash; nil: none)
-- or a --unique one (jobd_unique, under a job id of its own: jobd.job mark_key).
local function take_note(t, waiters, group, stream, id, fields)
  local batch, incarnation, unique = nil, nil, false -- one pass over the fields (batch_in's rule)
  for i = 1, #fields - 1, 2 do
    local name = fields[i]
    if name == 'jobd_batch' then batch = fields[i + 1]
    elseif name == 'jobd_batch_incarnation' then incarnation = fields[i + 1]
    elseif name == 'jobd_unique' then unique = true end
  end
  local job = (batch or waiters or unique) and job_id_of(id, fields)
  unique = unique and job ~= id
  if not (batch or unique or (waiters and waited_for(waiters, job))) then return end
  local taken = taken_key(t)
  if not taken then return end
  local note = {job, batch or '', incarnation or ''}
  if unique then note[4] = 1 end
  redis.call('HSET', taken, stream .. '|' .. id, cmsgpack.pack(note))
  sweep_taken(taken, group)
end

-- The job id, batch, incarnation and whether it is --unique (true, else nil) the taken record at
-- field ``at`` of the taken hash ``t`` holds (nil each when there is none, or it is not one jobd
-- wrote); the record is removed.
local function taken_job(t, at)
  local taken = taken_key(t)
  local packed = taken and redis.call('HGET', taken, at)
  if not packed then return nil end
  redis.call('HDEL', taken, at)
  local ok, t = pcall(cmsgpack.unpack, packed)
  if not (ok and type(t) == 'table' and type(t[1]) == 'string') then return nil end
  local batch = type(t[2]) == 'string' and t[2] ~= '' and t[2] or nil
  return t[1], batch, type(t[3]) == 'string' and t[3] ~= '' and t[3] or nil, t[4] == 1 or nil
end

-- Job ``job`` (its ``batch`` and ``incarnation``, nil each when none) of entry ``id`` of
-- ``stream`` ended 'lost' (``lost_end``): its history record and event (history ``h``, consumer
-- ``me``, at ``now``), told through ``w`` to its batch and its waiters, as a failure. Its marks
-- go as every end's do: its cancellation marks in ``marks`` (the queue's, known to be a zset;
-- nil: none), 'id:STREAM|ENTRY' and 'job:JOB' (one left behind would cancel the job id's next
-- enqueue unrun), and its --unique mark ``unique`` (nil: none known) while it says 'queued',
-- as dead_letter.lua's (else the job id sent again is refused as a duplicate for days).
local function lost_job(h, w, stream, id, job, batch, incarnation, me, now, marks, unique)
  if marks then redis.call('ZREM', marks, 'id:' .. stream .. '|' .. id, 'job:' .. job) end
  if unique and says_queued(unique) then redis.call('DEL', unique) end
  local record = cjson.encode({event = 'lost', stream = stream, entry = id, consumer = me,
    detail = 'its entry was deleted while pending'})
  remember(h, linked({event = 'lost', job = job, record = record, extras = {'consumer', me}},
    batch, incarnation), now, id)
  ended(w, job, 'lost', batch, incarnation)
end

-- Entries ``entries`` of ``stream`` were deleted while pending, and this step took them out of
-- the group (XCLAIM and XAUTOCLAIM purge such an entry on Redis 7.0+; on 6.2 the caller acks
-- it): one step does so once, so each job's end is written once, whichever daemon, and however
-- often a call is sent again. Its end, 'lost', goes into its history and the queue's events
-- and is told to its batch and its waiters (``lost_job``). Its job id, batch and incarnation
-- come from its taken record (in the taken hash ``t``, ``taken_at``); else its job id from
-- ``jobs`` (by "STREAM|ENTRY": the ones the holder sent, its active record's: lib/jobs.lua
-- gone_not_running), else it is the entry's id (a job of no workflow whose daemon died, or
-- another took the entry out, before its handler ran half a second). ``marks``: the queue's
-- cancellation marks key (``marks_of``); ``uniques``: the --unique marks of the entries known
-- to have one, by "STREAM|ENTRY" (the holder's: it read them; none for a reclaimer) (``lost_job``).
-- Returns the job ids of the --unique jobs (by their taken records) whose mark was not among
-- ``uniques``: a script may not write a key it was not sent, so its caller frees those marks
-- in a call of its own (reclaim.lua's reply; lost_marks.lua).
local function lost_end(h, w, t, stream, entries, jobs, me, now, marks, uniques)
  local unfreed = {}
  for _, id in ipairs(entries) do
    local at = stream .. '|' .. id
    local job, batch, incarnation, unique = taken_job(t, at)
    lost_job(h, w, stream, id, job or jobs[at] or id, batch, incarnation, me, now, marks,
      uniques[at])
    if unique and not uniques[at] then unfreed[#unfreed + 1] = job end
  end
  return unfreed
end

-- Entries ``deleted`` of ``stream``, held by ``me`` (this consumer) and taken out of the group
-- by its XCLAIM in this step (renew.lua, keep.lua), end 'lost' (``lost_end``): each job under
-- the job id its holder sent (``known``, by "STREAM|ENTRY"), else its running record's
-- (lib/jobs.lua gone_not_running), with its marks (``marks``, ``uniques``: ``lost_end``'s);
-- then the history ``h`` is trimmed.
local function lost_held(h, w, t, stream, deleted, known, me, marks, uniques)
  local now = now_ms()
  local jobs = gone_not_running(h, stream, deleted)
  for at, job in pairs(known) do jobs[at] = job end
  lost_end(h, w, t, stream, deleted, jobs, me, now, marks, uniques)
  trim_history(h, now)
end

-- The cancellation marks key ``key`` (cancel.lua) when it is one (a zset), else nil: a key of
-- another type there (someone else's) is no mark.
local function marks_of(key)
  return key and redis.call('TYPE', key).ok == 'zset' and key or nil
end

-- The taken record of entry ``id`` of ``stream`` goes with the end of its job, if the job is a
-- workflow job (of a batch, or waited for: ``w.watched``, the queue has waiters) or may be a
-- --unique one (``kept``: its caller was sent its job id's mark): a record wait_on.lua wrote for
-- a job read before anything waited for it is swept by no read (none of its job writes one),
-- and the hash would keep it for ever. A job of neither costs nothing.
local function untake(t, w, stream, id, batch, kept)
  if not (batch or kept or w.watched) then return end
  local taken = taken_key(t)
  if taken then redis.call('HDEL', taken, stream .. '|' .. id) end
end
