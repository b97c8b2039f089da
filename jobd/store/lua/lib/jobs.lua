-- lib/jobs.lua: what several scripts share about a job's fields, a delayed member and a due time.
-- Not a script: scripts.py puts it before each script whose first line is '--! uses jobs.lua'
-- (Redis runs every script alone, so shared Lua is shared by being sent with each one).

local MAX_FIELDS = 1000 -- jobd.job.MAX_FIELDS

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

