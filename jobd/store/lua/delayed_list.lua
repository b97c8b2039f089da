-- delayed_list.lua: the jobs waiting in a delayed set, decoded, soonest first.
--
-- KEYS[1]  the queue's delayed set
-- ARGV[1]  at most this many
--
-- Returns {{score, '', name, value, …}, …}; a member that is not a job (promote.lua will
-- dead-letter it as malformed) is {score, why, the member's bytes}. Read-only: for
-- `jobd status` and tests.
local MAX_FIELDS = 1000 -- jobd.job.MAX_FIELDS

-- The job in a member, else nil and why it is none (the same checks as promote.lua).
local function decode(member)
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

local out = {}
local members = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
for i = 1, #members, 2 do
  local job, why = decode(members[i])
  local row = {members[i + 1], why or ''}
  if job then
    for j = 2, #job do row[#row + 1] = job[j] end
  else
    row[3] = members[i]
  end
  out[#out + 1] = row
end
return out
