-- lib/jobs.lua: what several scripts share about a job's fields, a delayed member and a due time.
-- Not a script: scripts.py puts it before each script whose first line is '--! uses jobs.lua'
-- (Redis runs every script alone, so shared Lua is shared by being sent with each one).

local MAX_FIELDS = 1000 -- jobd.job.MAX_FIELDS
-- An entry idle longer than this was handed back (settle.lua 'back': XCLAIM … TIME 1 makes it
-- look idle since 1970, about 56 years); no lease comes near it.
local HANDED_BACK = 10 * 365 * 86400 * 1000

-- The job in a delayed member, else nil and why it is none: one cmsgpack array {unique id,
-- name, value, …} of 1 to MAX_FIELDS fields, each name and value a string.
local function decode_member(member)
  local ok, rest, job = pcall(cmsgpack.unpack_one, member)
  if not ok or rest ~= -1 then return nil, 'not one msgpack value' end
  if type(job) ~= 'table' then return nil, 'not an array' end
  local n = #job
  if n < 3 then return nil, 'no fields' end
  if n % 2 == 0 then return nil, 'a field name without a value' end
  if (n - 1) / 2 > MAX_FIELDS then
    return nil, string.format('more than %d fields (jobd.job.MAX_FIELDS)', MAX_FIELDS)
  end
  for i = 2, n do
    if type(job[i]) ~= 'string' then return nil, 'a field name or value is not a string' end
  end
  return job
end

-- An error reply when ARGV[first..] are not 1 to MAX_FIELDS name, value pairs, else nil.
-- ``script`` names the caller in the message, ``after`` says what comes before the fields.
local function check_fields(script, first, after)
  local count = #ARGV - first + 1
  if count < 2 or count % 2 == 1 then
    return redis.error_reply(string.format(
      'ERR %s: the job fields must be name, value pairs, at least one: got %d argument(s)%s',
      script, math.max(count, 0), after))
  end
  if count / 2 > MAX_FIELDS then
    return redis.error_reply(string.format(
      'ERR %s: %d fields, more than %d (jobd.job.MAX_FIELDS)', script, count / 2, MAX_FIELDS))
  end
end

-- Redis's time now, in Unix ms, and the due time ``arg`` gives: Unix ms, or '+' and ms from
-- now on Redis's clock. The due time is nil when ``arg`` is neither; its score is the exact
-- string to store (Unix ms as given, or the sum without an exponent).
local function due_time(arg)
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  local delay = string.match(arg, '^%+(%d+)$')
  if delay then
    local due = now + tonumber(delay)
    return now, due, string.format('%d', due)
  end
  return now, tonumber(arg), arg
end

-- The error reply for a due time that is neither form.
local function bad_due(script, arg)
  return redis.error_reply(
    'ERR ' .. script .. ': the due time must be Unix ms, or + and ms from now: got ' .. arg)
end

-- The job id of entry ``id`` with flat fields {name, value, …}, as jobd.job reads it: the
-- producer's job_id, else jobd's jobd_job_id (a retry's), each only when not empty and without a
-- NUL byte, else the entry's id.
local function job_id_of(id, fields)
  local found = {}
  for i = 1, #fields, 2 do found[fields[i]] = fields[i + 1] end
  for _, name in ipairs({'job_id', 'jobd_job_id'}) do
    local v = found[name]
    if v and v ~= '' and not string.find(v, '\0', 1, true) then return v end
  end
  return id
end

-- Redis's time, Unix ms.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end


-- History and events (docs/history.md): a job's records in the queue's history hash, and the
-- queue's events stream, written by the script that settles each attempt, in the same step.
-- Nothing here may fail a script half-way (Redis does not undo what a script already did): a
-- key of another type is skipped (``history_at``), and an event's XADD is a pcall whose error
-- is ignored (someone else's stream at the key may refuse every new id: its last id the
-- largest there is).

local HISTORY_BYTES = 65536 -- jobd.store.keys.HISTORY_BYTES: a job's records kept, at most
local TRIM_STEP = 100 -- history entries one call trims at most (each call adds fewer)

-- The history of a queue: KEYS[k .. k+3] are its history hash, history:at set, active hash and
-- events stream; ``settings`` is "MAX_AGE_MS MAXLEN EVENTS QUEUE" (jobd.store.history_of). A key
-- of another type there (someone else's) is left alone and not written: an outcome is never
-- refused for want of its record.
local function history_at(k, settings)
  local max_age, maxlen, events, queue = string.match(settings, '^(%d+) (%d+) (%d+) (.*)$')
  local function ours(key, kind)
    local t = redis.call('TYPE', key).ok
    return t == 'none' or t == kind
  end
  -- No active hash: no job runs long enough to have a record, nothing to delete (most calls).
  return {
    hash = KEYS[k], at = KEYS[k + 1], active = KEYS[k + 2], events = KEYS[k + 3],
    max_age = tonumber(max_age), maxlen = tonumber(maxlen), events_max = events, queue = queue,
    records = tonumber(maxlen) > 0 and ours(KEYS[k], 'hash') and ours(KEYS[k + 1], 'zset'),
    running = redis.call('TYPE', KEYS[k + 2]).ok == 'hash', emits = ours(KEYS[k + 3], 'stream'),
  }
end

-- A note of what happened to a job, as sent from ARGV[i]: event, job id, ms since it started
-- ('' when it did not run; Redis's time less this is its started_at), the record (a JSON object's text, '{' first), n, then n name, value pairs for the
-- event. Returns the note and the index after it.
local function note_at(i)
  local n = tonumber(ARGV[i + 4])
  local extras = {}
  for j = i + 5, i + 4 + 2 * n do extras[#extras + 1] = ARGV[j] end
  return {event = ARGV[i], job = ARGV[i + 1], ran = tonumber(ARGV[i + 2]), record = ARGV[i + 3],
    extras = extras}, i + 5 + 2 * n
end

-- The job ``job`` no longer runs as ``entry`` of ``stream``: its active record goes, if it is
-- that entry's (a record of the job's later delivery, elsewhere, stays).
local function not_running(h, job, stream, entry)
  if not h.running then return end
  local v = redis.call('HGET', h.active, job)
  local prefix = stream .. '|' .. entry .. '\n'
  if v and string.sub(v, 1, #prefix) == prefix then redis.call('HDEL', h.active, job) end
end

-- The job's record and the text that goes before a new one: at most HISTORY_BYTES in all, the
-- oldest whole records dropped; a new record alone larger than that is kept alone.
local function appended(old, line)
  if not old then return line end
  local all = old .. '\n' .. line
  if #all <= HISTORY_BYTES then return all end
  local cut = string.find(all, '\n', #all - HISTORY_BYTES, true)
  if cut and cut <= #old then return string.sub(all, cut + 1) end
  return line
end

-- An event in the queue's events stream, ``event`` then ``fields`` (name, value, …): an outcome
-- (``remember``) or an operator's action. Best effort: see above.
local function emit(h, event, fields)
  if not h.emits then return end
  local e = {h.events, 'MAXLEN', '~', h.events_max, '*', 'event', event, 'queue', h.queue}
  for _, v in ipairs(fields) do e[#e + 1] = v end
  redis.pcall('XADD', unpack(e))
end

-- Write ``note`` at Redis ms ``now`` about ``entry``: the job's record (with at, started_at when
-- it ran, and the numbers in ``more``, name, value, …) and the queue's event (none when the
-- note is ``quiet``: a step of the job's that is no outcome, such as its promotion).
local function remember(h, note, now, entry, more)
  more = more or {}
  if h.records then
    local head = {'{"at":', string.format('%d', now)}
    if note.ran then head[#head + 1] = string.format(',"started_at":%d', now - note.ran) end
    for i = 1, #more, 2 do head[#head + 1] = string.format(',"%s":%d', more[i], more[i + 1]) end
    local line = table.concat(head) .. ',' .. string.sub(note.record, 2)
    -- A job's first record (most are) costs one command; a later one reads those before it.
    if redis.call('HSETNX', h.hash, note.job, line) == 0 then
      redis.call('HSET', h.hash, note.job, appended(redis.call('HGET', h.hash, note.job), line))
    end
    redis.call('ZADD', h.at, now, note.job)
    h.added = (h.added or 0) + 1
  end
  if not note.quiet then
    local fields = {'job', note.job}
    if entry then fields[#fields + 1] = 'entry'; fields[#fields + 1] = entry end
    for _, v in ipairs(note.extras) do fields[#fields + 1] = v end
    for i = 1, #more, 2 do
      fields[#fields + 1] = more[i]; fields[#fields + 1] = string.format('%d', more[i + 1])
    end
    emit(h, note.event, fields)
  end
end

-- History beyond max_age or maxlen goes, a bounded step a call (TRIM_STEP, plus the jobs this
-- call recorded, so a call never leaves more than it found over the caps): once per script.
local function trim_history(h, now)
  if not h.records then return end
  local step = TRIM_STEP + (h.added or 0)
  local old = redis.call('ZRANGEBYSCORE', h.at, '-inf', '(' .. string.format('%d', now - h.max_age),
    'LIMIT', 0, step)
  local over = redis.call('ZCARD', h.at) - #old - h.maxlen
  if over > 0 then
    local popped = redis.call('ZRANGE', h.at, #old, #old + math.min(over, step) - 1)
    for _, job in ipairs(popped) do old[#old + 1] = job end
  end
  if #old > 0 then
    for first = 1, #old, 1000 do -- unpack takes a few thousand values at most
      local last = math.min(first + 999, #old)
      redis.call('HDEL', h.hash, unpack(old, first, last))
      redis.call('ZREM', h.at, unpack(old, first, last))
    end
  end
end
