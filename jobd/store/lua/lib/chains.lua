
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
