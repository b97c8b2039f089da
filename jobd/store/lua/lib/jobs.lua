-- lib/jobs.lua: what several scripts share about a job's fields, a delayed member and a due time.
-- Not a script: scripts.py puts it before each script whose first line is '--! uses jobs.lua'
-- (Redis runs every script alone, so shared Lua is shared by being sent with each one).

local MAX_FIELDS = 1000 -- jobd.job.MAX_FIELDS
local MAX_JOB_ID = 1024 -- jobd.job.MAX_JOB_ID: bytes; an entry with a longer one never runs
-- An entry idle longer than this was handed back (settle.lua 'back': XCLAIM … TIME 1 makes it
-- look idle since 1970, about 56 years); no lease comes near it.
local HANDED_BACK = 10 * 365 * 86400 * 1000

-- The job in a delayed member, else nil and why it is none: one cmsgpack array {unique id,
-- name, value, …} of 1 to MAX_FIELDS fields, each name and value a string. Third: how many
-- values the member decoded to (an array's length, 0 for anything else), whatever it was.
local function decode_member(member)
  local ok, rest, job = pcall(cmsgpack.unpack_one, member)
  if not ok or rest ~= -1 then return nil, 'not one msgpack value', 0 end
  if type(job) ~= 'table' then return nil, 'not an array', 0 end
  local n = #job
  if n < 3 then return nil, 'no fields', n end
  if n % 2 == 0 then return nil, 'a field name without a value', n end
  if (n - 1) / 2 > MAX_FIELDS then
    return nil, string.format('more than %d fields (jobd.job.MAX_FIELDS)', MAX_FIELDS), n
  end
  for i = 2, n do
    if type(job[i]) ~= 'string' then return nil, 'a field name or value is not a string', n end
  end
  return job, nil, n
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
-- NUL byte, else the entry's id; the entry's id too when the first one present is longer than
-- MAX_JOB_ID (the entry is malformed: never run, and its id is never copied).
local function job_id_of(id, fields)
  local found = {}
  for i = 1, #fields, 2 do found[fields[i]] = fields[i + 1] end
  for _, name in ipairs({'job_id', 'jobd_job_id'}) do
    local v = found[name]
    if v and #v > MAX_JOB_ID then return id end
    if v and v ~= '' and not string.find(v, '\0', 1, true) then return v end
  end
  return id
end

-- Which enqueue the job of flat fields {name, value, …} is of, when its entry says (jobd_origin,
-- as jobd.job reads it: printable ASCII, 64 bytes at most), else nil: its history record and
-- event carry it as "origin" (a waiter knows its job's ends by it: jobd.waiting).
local function origin_of(fields)
  for i = 1, #fields, 2 do
    local v = fields[i + 1]
    if fields[i] == 'jobd_origin' then
      if #v > 0 and #v <= 64 and not string.find(v, '[^\32-\126]') then return v end
      return nil
    end
  end
  return nil
end

-- The event fields {name, value, …} ``extras`` with the job's origin (``origin_of``) added.
local function with_origin(extras, origin)
  if origin then extras[#extras + 1] = 'origin'; extras[#extras + 1] = origin end
  return extras
end

-- Add ``n`` to ``field`` of the per-minute counters ``key``, kept ``ttl`` seconds. Called after
-- the writes it counts, so it never fails the script: someone else's key at that name, or a
-- field that is no integer, leaves the count out.
local function add_count(key, field, n, ttl)
  if type(redis.pcall('HINCRBY', key, field, n)) == 'number' then
    redis.pcall('EXPIRE', key, ttl)
  end
end

-- What a reader is handed of an entry with flat fields {name, value, …}: the fields, or a
-- stand-in that brings none of its data to the daemon when they are more than MAX_FIELDS pairs
-- (counted as they are, a name repeated or not: jobd_overwide, how many) or hold more than
-- ``limit`` bytes in all (names and values; 0: no limit; jobd_oversize, the entry's size in
-- bytes). Its job_id, jobd_job_id and jobd_unique come with it, the last of each (as jobd.job
-- reads a repeated name), cut to MAX_JOB_ID + 1 bytes (a longer job id stays too long: the
-- reader refuses it as such); and so do the workflow fields its end is told with (its dead
-- letter counted in its batch: jobd_batch, jobd_origin, jobd_parent), each when it is no longer
-- than STAND_IN_KEPT says (longer: no value jobd wrote, left out, never cut into another batch's
-- id). jobd.job reads the stand-in as a malformed job. So a reader is handed at most MAX_FIELDS
-- pairs and ``limit`` bytes of an entry (of a stand-in, 8 pairs of at most 8 KiB in all).
local MAX_BATCH = 800 -- a batch id's bytes at most (jobd.job.MAX_BATCH_BYTES)
local STAND_IN_KEPT = {
  {'job_id', MAX_JOB_ID + 1, true}, {'jobd_job_id', MAX_JOB_ID + 1, true},
  {'jobd_unique', MAX_JOB_ID + 1, true},
  -- jobd.workflows: a batch id is at most 200 characters (800 bytes of UTF-8); an origin at
  -- most jobd.job.MAX_ORIGIN bytes; a parent a queue's name, a space and a job id.
  {'jobd_batch', MAX_BATCH, false}, {'jobd_origin', 64, false}, {'jobd_parent', 2 * MAX_JOB_ID, false},
  -- which batch of that id (lua/batch.lua's incarnation: Redis's time in µs, digits)
  {'jobd_batch_incarnation', 32, false},
}
local function sized(fields, limit)
  local out
  if #fields > 2 * MAX_FIELDS then
    out = {'jobd_overwide', string.format('%d', #fields / 2)}
  else
    if limit <= 0 then return fields end
    local size = 0
    for i = 1, #fields do size = size + #fields[i] end
    if size <= limit then return fields end
    out = {'jobd_oversize', tostring(size)}
  end
  local last = {}
  for _, kept in ipairs(STAND_IN_KEPT) do last[kept[1]] = false end
  for i = 1, #fields, 2 do
    if last[fields[i]] ~= nil then last[fields[i]] = fields[i + 1] end
  end
  for _, kept in ipairs(STAND_IN_KEPT) do
    local name, most, cut = kept[1], kept[2], kept[3]
    local value = last[name]
    if value and cut then value = string.sub(value, 1, most) end
    if value and #value <= most then
      out[#out + 1] = name
      out[#out + 1] = value
    end
  end
  return out
end

-- The batch a job's fields (name, value, …) name (jobd_batch), or nil, and its incarnation
-- (jobd_batch_incarnation, or nil): for the scripts that end a job with no note of its attempt
-- (cancelled unrun: cancelled.lua, cancel_delayed.lua, promote.lua; lib/workflows.lua ended),
-- and for its records' batch link (``linked``).
local function batch_in(fields)
  local batch, incarnation = nil, nil
  for i = 1, #fields - 1, 2 do
    if fields[i] == 'jobd_batch' then batch = fields[i + 1] end
    if fields[i] == 'jobd_batch_incarnation' then incarnation = fields[i + 1] end
  end
  return batch, incarnation
end

-- Unicode's spaces beyond ASCII (Python's \s: jobd.job BATCH_ID); U+2000-U+200A too.
local SPACES = {[0x85] = true, [0xa0] = true, [0x1680] = true, [0x2028] = true, [0x2029] = true,
  [0x202f] = true, [0x205f] = true, [0x3000] = true}
-- Whether ``s`` is a batch id jobd.workflow_input.check_batch_id takes (jobd.job.is_batch_id,
-- the same rule): UTF-8 (no overlong form, no surrogate), 1 to 200 characters, none a space, a control
-- character, '{' or '}' (so 1 to MAX_BATCH bytes: a longer value is read no further than its
-- 201st character). A record links no other (an id not UTF-8 is shown escaped: the byte 0xff as
-- the text \xff, another batch's id), nor does a dead letter keep it (dead_letter.lua KEPT).
local function batch_id_ok(s)
  local i, n, chars = 1, #s, 0
  while i <= n do
    local c, cp, len = string.byte(s, i), nil, nil
    if c < 0x80 then cp, len = c, 1
    elseif c >= 0xc2 and c <= 0xdf then cp, len = c - 0xc0, 2
    elseif c >= 0xe0 and c <= 0xef then cp, len = c - 0xe0, 3
    elseif c >= 0xf0 and c <= 0xf4 then cp, len = c - 0xf0, 4
    else return false end
    if i + len - 1 > n then return false end
    for k = i + 1, i + len - 1 do
      local b = string.byte(s, k)
      if b < 0x80 or b > 0xbf then return false end
      cp = cp * 64 + (b - 0x80)
    end
    if (len == 3 and (cp < 0x800 or (cp >= 0xd800 and cp <= 0xdfff))) or
        (len == 4 and (cp < 0x10000 or cp > 0x10ffff)) then return false end
    if cp <= 0x20 or cp == 0x7f or cp == 0x7b or cp == 0x7d or SPACES[cp] or
        (cp >= 0x2000 and cp <= 0x200a) then return false end
    chars = chars + 1
    if chars > 200 then return false end
    i = i + len
  end
  return chars >= 1
end

-- The batch link of a record that no attempt's note tells (docs/workflows.md: a member's
-- records carry ``batch``): ``note`` (for ``remember``) with ``batch``, the job's jobd_batch
-- (``batch_in``), when it is one jobd writes: a batch id (``batch_id_ok``, 1 to MAX_BATCH bytes;
-- another, someone's XADD, is dropped, as store/notes.py drops it: a record and an event stay
-- bounded, and never name another batch), and which batch of that id (``incarnation``, its
-- jobd_batch_incarnation: digits, in the record only, as ``batch_incarnation``: `jobd job` tells an earlier batch of the id by it).
-- ``remember`` writes them into the record and the batch, first of its fields, into the event.
-- The one place every Lua writer links a record to its batch; an attempt's note
-- (store/notes.py links) carries its own, by the same rule.
local function linked(note, batch, incarnation)
  if type(batch) == 'string' and batch_id_ok(batch) then
    note.batch = batch
    if type(incarnation) == 'string' and #incarnation <= 32 and
        string.match(incarnation, '^%d+$') then
      note.batch_incarnation = incarnation
    end
  end
  return note
end

-- Redis's time, Unix ms.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end


-- History and events (docs/concepts/history.md): a job's records in the queue's history hash, and the
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
-- event. Returns the note and the index after it. A pair batch_incarnation, VALUE second (after
-- batch: store/notes.py) is the note's ``incarnation`` (lib/workflows.lua batch_of), no event field.
local function note_at(i)
  local n = tonumber(ARGV[i + 4])
  local extras, incarnation = {}, nil
  for j = i + 5, i + 4 + 2 * n do extras[#extras + 1] = ARGV[j] end
  if extras[3] == 'batch_incarnation' then
    incarnation = extras[4]
    table.remove(extras, 3); table.remove(extras, 3)
  end
  return {event = ARGV[i], job = ARGV[i + 1], ran = tonumber(ARGV[i + 2]), record = ARGV[i + 3],
    extras = extras, incarnation = incarnation}, i + 5 + 2 * n
end

-- The job ``job`` no longer runs as ``entry`` of ``stream``: its active record goes, if it is
-- that entry's (a record of the job's later delivery, elsewhere, stays).
local function not_running(h, job, stream, entry)
  if not h.running then return end
  local v = redis.call('HGET', h.active, job)
  local prefix = stream .. '|' .. entry .. '\n'
  if v and string.sub(v, 1, #prefix) == prefix then redis.call('HDEL', h.active, job) end
end

-- The entries ``entries`` (a list of ids) of ``stream`` are gone (deleted or trimmed while
-- pending): their job ids, which name their active records, can no longer be read from them. The
-- records are looked for by the entry they name, over the hash (the jobs running now of the
-- queue; this is rare): one pass for all of a call's gone entries (one pass each cost 1.9 s in
-- one script for 100 entries over 20 000 records, Redis blocked meanwhile), and at most
-- GONE_STEPS pages of it, so a call's cost is bounded whatever the hash holds. A record a pass
-- cut short leaves is stale: readers check it against XPENDING (store/history.py), and the
-- job's next start replaces it. Returns the job ids of the records removed, by "STREAM|ENTRY".
local GONE_STEPS = 32 -- HSCAN pages of ~1000 fields: a pass over a hash of ~30 000 records
local function gone_not_running(h, stream, entries)
  local jobs = {}
  if not h.running or #entries == 0 then return jobs end
  local gone = {}
  for _, entry in ipairs(entries) do gone[stream .. '|' .. entry] = true end
  local cursor, steps = '0', 0
  repeat
    local page = redis.call('HSCAN', h.active, cursor, 'COUNT', 1000)
    cursor, steps = page[1], steps + 1
    for i = 1, #page[2], 2 do
      local cut = string.find(page[2][i + 1], '\n', 1, true)
      local at = cut and string.sub(page[2][i + 1], 1, cut - 1)
      if at and gone[at] then
        redis.call('HDEL', h.active, page[2][i])
        jobs[at] = page[2][i]
      end
    end
  until cursor == '0' or steps >= GONE_STEPS
  return jobs
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
    if note.batch then head[#head + 1] = ',"batch":' .. cjson.encode(note.batch) end
    if note.batch_incarnation then
      head[#head + 1] = ',"batch_incarnation":"' .. note.batch_incarnation .. '"'
    end
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
    if note.batch then fields[#fields + 1] = 'batch'; fields[#fields + 1] = note.batch end
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


-- Cancellation marks (cancel.lua). A mark 'id:STREAM|ENTRY' is held until its entry is settled:
-- scored HELD (+inf), no expiry reaches it; the script that acknowledges the entry removes it.
-- 'job:JOB_ID' marks (a job found nowhere, or copies of one) are scored by their expiry (ms).
local HELD = '+inf'
local SWEEP = 20 -- held marks a call looks at for entries gone (sweep_held)

-- How stream id ``a`` compares with ``b`` ('MS-SEQ' both): -1, 0 or 1, or nil when either is
-- not such an id. Compared as text, never as Lua numbers: each part is up to 2^64 - 1, and a Lua
-- number (a double) is exact only to 2^53 (one producer's explicit id past that made ids that
-- differ compare equal). Leading zeros are ignored; then the longer part is the larger, and
-- parts of one length compare as text.
local function id_cmp(a, b)
  local ams, aseq = string.match(a, '^0*(%d-)%-0*(%d-)$')
  local bms, bseq = string.match(b, '^0*(%d-)%-0*(%d-)$')
  if not (ams and bms) or not (string.find(a, '^%d+%-%d+$') and string.find(b, '^%d+%-%d+$')) then
    return nil
  end
  for _, pair in ipairs({{ams, bms}, {aseq, bseq}}) do
    local x, y = pair[1], pair[2]
    if #x ~= #y then return #x < #y and -1 or 1 end
    if x ~= y then return x < y and -1 or 1 end
  end
  return 0
end

-- Whether stream id ``a`` comes after ``b`` ('MS-SEQ' both; false when either is not one).
local function id_after(a, b)
  return id_cmp(a, b) == 1
end

-- The last delivered id of ``group`` on ``stream`` ('0-0' when nothing was delivered, or there
-- is no such group or stream), and whether the group exists. Never fails (someone else's key).
local function last_delivered(stream, group)
  local groups = redis.pcall('XINFO', 'GROUPS', stream)
  if type(groups) ~= 'table' or groups.err then return '0-0', false end
  for _, g in ipairs(groups) do
    local name, last = nil, nil
    for i = 1, #g, 2 do
      if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then last = g[i + 1] end
    end
    if name == group then return last, true end
  end
  return '0-0', false
end

-- Whether the --unique mark at ``key`` says 'queued'; a key of another type (someone else's)
-- does not, and never fails the script (it runs after writes).
local function says_queued(key)
  return redis.pcall('GET', key) == 'queued'
end

-- The hash tag of ``key`` as Redis Cluster reads it (the text between its first '{' and the
-- first '}' after it, when not empty), else the whole key: keys with the same one share a slot.
local function hash_tag(key)
  local open = string.find(key, '{', 1, true)
  if open then
    local close = string.find(key, '}', open + 1, true)
    if close and close > open + 1 then return string.sub(key, open + 1, close - 1) end
  end
  return key
end

-- Held marks whose entry can no longer run (not pending, and not waiting to be delivered:
-- settled by a script that does not know of marks, its data trimmed, its stream gone) are
-- removed: at most ``n`` held marks of ``marks`` (a zset) looked at a call, whatever their
-- stream (the queue's, a level's, or one a reload left behind: each mark is checked against its
-- own stream, which shares the marks' slot), from a place that moves with Redis's clock, so
-- marks whose acknowledger never came cannot pile up. A mark of an entry still waiting in a
-- stream no daemon reads now (a priority level removed from the config) is kept: the job would
-- run if the level came back. ``group`` is the queue's group (its levels share it).
local function sweep_held(marks, group, n)
  local total = redis.call('ZCOUNT', marks, HELD, HELD)
  if total == 0 then return end
  local t = redis.call('TIME')
  local from = tonumber(t[2]) % total
  local page = redis.call('ZRANGEBYSCORE', marks, HELD, HELD, 'LIMIT', from, n)
  if #page < n and from > 0 then -- from the start again: n or all of them, whichever is less
    for _, m in ipairs(redis.call('ZRANGEBYSCORE', marks, HELD, HELD, 'LIMIT', 0,
                                  math.min(from, n - #page))) do
      page[#page + 1] = m
    end
  end
  local tag = hash_tag(marks)
  local kinds, lasts = {}, {}
  for _, m in ipairs(page) do
    -- 'id:STREAM|ENTRY': the entry id has no '|', the stream may (its last '|' ends it).
    local stream, id = string.match(m, '^id:(.+)|([^|]*)$')
    local live = false -- not a mark cancel.lua writes (someone else's member): removed
    if stream and hash_tag(stream) == tag and string.match(id, '^%d+%-%d+$') then
      kinds[stream] = kinds[stream] or redis.call('TYPE', stream).ok
      if kinds[stream] == 'stream' then
        local p = redis.pcall('XPENDING', stream, group, id, id, 1)
        if type(p) ~= 'table' or p.err then
          live = true -- no group: cannot tell; left for a later call
        elseif #p == 0 then
          lasts[stream] = lasts[stream] or last_delivered(stream, group)
          live = #redis.call('XRANGE', stream, id, id) == 1 and id_after(id, lasts[stream])
        else
          live = true
        end
      end
    end
    if not live then redis.call('ZREM', marks, m) end
  end
end

-- An entry `jobd cancel` marked that ended another way as the cancel landed (its handler failed
-- on its own, or it is poison, expired or malformed): acknowledged as cancelled instead, in the
-- caller's step: its marks removed (the held one, ``by_id``, and its job id's: one left behind
-- would cancel the job's next enqueue, or a requeue), its --unique mark (``unique``, optional)
-- deleted if it still says 'queued', its history record and event written, counted in
-- ``stats`` (kept ``ttl`` seconds). ``detail`` says what became of it instead.
local function cancelled_instead(stream, group, me, id, h, note, now, marks, by_id, unique,
                                 stats, ttl, detail)
  redis.call('XACK', stream, group, id)
  redis.call('ZREM', marks, by_id, 'job:' .. note.job)
  if unique and says_queued(unique) then redis.call('DEL', unique) end
  not_running(h, note.job, stream, id)
  local origin, batch = nil, nil -- the attempt's note names them (jobd.store.notes)
  for i = 1, #note.extras, 2 do
    if note.extras[i] == 'origin' then origin = note.extras[i + 1] end
    if note.extras[i] == 'batch' then batch = note.extras[i + 1] end
  end
  local record = cjson.encode({event = 'cancelled', stream = stream, entry = id, consumer = me,
    detail = detail, origin = origin})
  remember(h, linked({event = 'cancelled', job = note.job, record = record,
    extras = with_origin({'consumer', me}, origin)}, batch, note.incarnation), now, id)
  trim_history(h, now)
  add_count(stats, 'cancelled', 1, ttl)
end


-- Follow-ups (docs/workflows.md): jobs a handler asked for in its JOBD_ENQUEUE file, added with
-- its acknowledgement (settle.lua) or, on a Redis Cluster, moved out of its queue's outbox
-- (follow_up.lua).

-- The follow-ups of an entry as sent from ARGV[i]: their count, then each one's queue, stream,
-- delayed set, mark, due time ('' for now), delayed member id, job id, n, then n name, value
-- pairs. Returns them and the index after them.
local function follow_ups_at(i)
  local out = {}
  local count = tonumber(ARGV[i])
  i = i + 1
  for _ = 1, count do
    local n = tonumber(ARGV[i + 7])
    local fields = {}
    for j = i + 8, i + 7 + 2 * n do fields[#fields + 1] = ARGV[j] end
    out[#out + 1] = {queue = ARGV[i], stream = ARGV[i + 1], delayed = ARGV[i + 2],
      mark = ARGV[i + 3], due = ARGV[i + 4], member = ARGV[i + 5], job = ARGV[i + 6],
      fields = fields}
    i = i + 8 + 2 * n
  end
  return out, i
end

-- Whether a job can be added to ``stream`` (or its ``delayed`` set): neither is someone else's
-- key of another type. Asked before anything of a follow-up is written: a script that fails
-- half-way keeps what it wrote (a parent acknowledged with half of its follow-ups).
local function can_add(stream, delayed)
  local s, d = redis.call('TYPE', stream).ok, redis.call('TYPE', delayed).ok
  return (s == 'stream' or s == 'none') and (d == 'zset' or d == 'none')
end

-- Add a job of flat ``fields`` {name, value, …}: to ``stream`` now when ``due`` is '' or due
-- by Redis's clock, else into the ``delayed`` set, its member {``member``, fields…} scored by
-- its due time (as schedule.lua adds one).
local function add_job(stream, delayed, due, member, fields)
  if due ~= '' then
    local now, at, score = due_time(due)
    if at and at > now then
      local m = {member}
      for _, v in ipairs(fields) do m[#m + 1] = v end
      redis.call('ZADD', delayed, score, cmsgpack.pack(m))
      return
    end
  end
  local args = {stream, '*'}
  for _, v in ipairs(fields) do args[#args + 1] = v end
  redis.call('XADD', unpack(args))
end
