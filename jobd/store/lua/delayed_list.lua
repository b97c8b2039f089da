--! uses jobs.lua
-- delayed_list.lua: the jobs waiting in a delayed set, decoded, soonest first.
--
-- KEYS[1]  the queue's delayed set
-- ARGV[1]  at most this many
-- ARGV[2]  from this index of the set on (0, the soonest, when not given): a page of it
--
-- Returns {{score, '', name, value, …}, …}; a member that is not a job (promote.lua will
-- dead-letter it as malformed) is {score, why, the member's bytes}. Read-only: for
-- `jobd status` and tests (a page: ZRANGE by index, never the whole set). The dashboard reads
-- delayed_shown.lua instead: only a member's job id and attempt leave Redis.

local out = {}
local first = tonumber(ARGV[2] or '0')
local members = redis.call('ZRANGE', KEYS[1], first, first + tonumber(ARGV[1]) - 1, 'WITHSCORES')
for i = 1, #members, 2 do
  local job, why = decode_member(members[i])
  local row = {members[i + 1], why or ''}
  if job then
    for j = 2, #job do row[#row + 1] = job[j] end
  else
    row[3] = members[i]
  end
  out[#out + 1] = row
end
return out
