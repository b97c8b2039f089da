
-- A queue's on_dead_letter (docs/workflows.md): the dead-letter record of a job, as JSON, is
-- enqueued into another queue in the step that writes the record (dead_letter.lua); on a Redis
-- Cluster into the queue's outbox instead, moved on as a follow-up is (store/outbox.py). Built
-- by jobd/store/chains.py.

-- The hook's job as sent from ARGV[i]: k, the count of what follows (0: no hook), then the
-- target queue's name, stream and delayed set, the outbox ('' on one Redis: added to the
-- target's stream here), the job's mark (store/keys.py follow_up), its job id, the index in
-- KEYS of the hook's first key, the four pieces of its JSON (around the record's id, its
-- failed_at, and its jobd_failed_at), then name, value pairs of its other fields. Returns it
-- (nil for none) and the index after it.
local function dead_letter_hook_at(i)
  local k = tonumber(ARGV[i])
  if k == 0 then return nil, i + 1 end
  local a = {queue = ARGV[i + 1], stream = ARGV[i + 2], delayed = ARGV[i + 3],
    outbox = ARGV[i + 4], mark = ARGV[i + 5], job = ARGV[i + 6], first = tonumber(ARGV[i + 7]),
    json = {ARGV[i + 8], ARGV[i + 9], ARGV[i + 10], ARGV[i + 11]}, fields = {}}
  for j = i + 12, i + k do a.fields[#a.fields + 1] = ARGV[j] end
  return a, i + k + 1
end

-- Why the hook's job cannot be written (someone else's key of another type where it goes), or
-- nil when it can. Asked before anything is written.
local function dead_letter_hook_blocked(a)
  if a.outbox ~= '' then
    local t = redis.call('TYPE', a.outbox).ok
    if t == 'stream' or t == 'none' then return nil end
    return 'not enqueued: the outbox ' .. a.outbox .. ' is a ' .. t
  end
  if can_add(a.stream, a.delayed) then return nil end
  return 'not enqueued: the stream or delayed set of queue ' .. a.queue .. ' is another type of key'
end

-- Enqueue the hook's job: its payload the JSON of record ``record_id`` written at ``now``, with
-- an event 'follow-ups' for the dead-lettered job ``job`` (entry ``id``) in history ``h``.
local function dead_letter_hook(a, record_id, now, h, job, id)
  local t = tostring(now)
  local fields = {'payload', a.json[1] .. record_id .. a.json[2] .. t .. a.json[3] .. t .. a.json[4]}
  for _, v in ipairs(a.fields) do fields[#fields + 1] = v end
  if a.outbox ~= '' then
    redis.call('XADD', a.outbox, '*', 'queue', a.queue, 'stream', a.stream, 'delayed', a.delayed,
      'mark', a.mark, 'due', '', 'member', '', 'job', a.job, 'fields', cmsgpack.pack(fields))
  else
    add_job(a.stream, a.delayed, '', '', fields)
  end
  emit(h, 'follow-ups', {'job', job, 'entry', id, 'count', '1', 'queues', a.queue})
end

-- A held job's hook (unblock.lua, expire_held.lua: lib/workflows.lua held_dead), from ARGV[i]:
-- k, the count of what follows (0: no hook), then the target queue's name, stream and delayed
-- set, the outbox ('' on one Redis) and the head of the job's mark (store/keys.py
-- follow_up_head: the held job's delayed member id and its id end it), the target queue's
-- max_payload ('': not known). Its job id is given with
-- each held job (store/chains.py held_hook_args), sent as jobd_job_id (never deduped: as
-- store/chains.py hook_args). Returns it (nil for none) and the index after.
local function held_hook_at(i)
  local k = tonumber(ARGV[i])
  if k == 0 then return nil, i + 1 end
  return {queue = ARGV[i + 1], stream = ARGV[i + 2], delayed = ARGV[i + 3], outbox = ARGV[i + 4],
    head = ARGV[i + 5], max_payload = k >= 6 and tonumber(ARGV[i + 6]) or nil}, i + k + 1
end

local CLIP = 4096 -- store/chains.py CLIP
local ROOM = 96 -- store/chains.py ROOM: the record's id and its time (twice) in the JSON

-- ``s`` as Python's decode('utf-8', 'backslashreplace') makes it: a byte not in valid UTF-8 as
-- the four characters \xNN (store/chains.py _text).
local function utf8_text(s)
  if not string.find(s, '[\128-\255]') then return s end
  local out, i, n = {}, 1, #s
  while i <= n do
    local c, len = string.byte(s, i), 0
    if c < 0x80 then len = 1
    elseif c >= 0xC2 and c <= 0xDF then len = 2
    elseif c >= 0xE0 and c <= 0xEF then len = 3
    elseif c >= 0xF0 and c <= 0xF4 then len = 4 end
    local ok = len > 0 and i + len - 1 <= n
    if ok and len > 1 then
      local lo, hi = 0x80, 0xBF
      if c == 0xE0 then lo = 0xA0 elseif c == 0xED then hi = 0x9F
      elseif c == 0xF0 then lo = 0x90 elseif c == 0xF4 then hi = 0x8F end
      local b = string.byte(s, i + 1)
      ok = b >= lo and b <= hi
      for x = i + 2, i + len - 1 do
        b = string.byte(s, x)
        ok = ok and b >= 0x80 and b <= 0xBF
      end
    end
    if ok then
      out[#out + 1] = string.sub(s, i, i + len - 1); i = i + len
    else
      out[#out + 1] = string.format('\\x%02x', c); i = i + 1
    end
  end
  return table.concat(out)
end

-- The four pieces of a held job's record's JSON (store/chains.py json_pieces): queue ``queue``,
-- job ``job``, ``fields`` the record's (name, value, … before jobd_failed_at), each value
-- longer than ``clip`` cut to it.
local function held_json(queue, job, fields, clip)
  local names, values, clipped = {}, {}, {}
  for i = 1, #fields - 1, 2 do
    local name, value = utf8_text(fields[i]), fields[i + 1]
    if #value > clip then
      clipped[#clipped + 1] = cjson.encode(name .. ' ' .. #value)
      value = string.sub(value, 1, clip)
    end
    if values[name] == nil then names[#names + 1] = name end
    values[name] = utf8_text(value)
  end
  local obj = {}
  for _, name in ipairs(names) do
    obj[#obj + 1] = cjson.encode(name) .. ':' .. cjson.encode(values[name])
  end
  local id = job == '' and 'null' or cjson.encode(utf8_text(job))
  local rest = '"}'
  if #clipped > 0 then rest = rest .. ',"clipped":[' .. table.concat(clipped, ',') .. ']' end
  return {'{"queue":' .. cjson.encode(queue) .. ',"id":"', '","job_id":' .. id .. ',"failed_at":',
    ',"fields":{' .. table.concat(obj, ',') .. ',"jobd_failed_at":"', rest .. '}'}
end

local function json_size(pieces)
  return #pieces[1] + #pieces[2] + #pieces[3] + #pieces[4] + ROOM
end

-- Why held job ``job``'s record (``fields``, as held_json) of queue ``queue`` cannot go to
-- hook ``hook`` (held_hook_at), or nil when it can: its key of another type
-- (dead_letter_hook_blocked), or its JSON above the hook queue's max_payload with each value
-- cut to nothing. Else the JSON, its values cut to the longest that fits (store/chains.py
-- json_pieces), is kept in ``hook.json`` for held_hook. Asked before anything is written.
local function held_hook_blocked(hook, queue, job, fields)
  local blocked = dead_letter_hook_blocked(hook)
  if blocked then return blocked end
  local most, json = hook.max_payload, held_json(queue, job, fields, CLIP)
  if most and json_size(json) > most then
    local least = json_size(held_json(queue, job, fields, 0))
    if least > most then
      return 'not enqueued: queue ' .. hook.queue .. "'s max_payload (" .. most ..
        ") is below the record's JSON, " .. least .. ' bytes with each value cut to nothing'
    end
    local low, high = 0, CLIP -- a cut that fits, one that does not: the longest that fits
    while high - low > 1 do
      local mid = math.floor((low + high) / 2)
      if json_size(held_json(queue, job, fields, mid)) <= most then low = mid else high = mid end
    end
    json = held_json(queue, job, fields, low)
  end
  hook.json = json
  return nil
end

-- Held job ``j`` of queue history ``h`` dead-lettered (record ``record_id``, its fields
-- ``fields`` before jobd_failed_at, at ``now``): its queue's hook ``hook`` (held_hook_at,
-- asked held_hook_blocked) enqueues job ``hook_job`` with the record's JSON, as
-- dead_letter.lua's does.
local function held_hook(hook, hook_job, j, h, fields, record_id, now)
  local a = {queue = hook.queue, stream = hook.stream, delayed = hook.delayed,
    outbox = hook.outbox, job = hook_job,
    mark = hook.head .. #j.member .. ':' .. j.member .. '|' .. j.job,
    json = hook.json or held_json(h.queue, j.job, fields, CLIP),
    fields = {'jobd_job_id', hook_job, 'jobd_parent', h.queue .. ' ' .. j.job}}
  dead_letter_hook(a, record_id, now, h, j.job, '')
end
