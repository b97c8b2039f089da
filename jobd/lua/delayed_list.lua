-- delayed_list.lua: the jobs waiting in a delayed set, decoded, soonest first.
--
-- KEYS[1]  the queue's delayed set
-- ARGV[1]  at most this many
--
-- Returns {{score, unique id, name, value, …}, …}. Read-only: for `jobd status` and tests.
local out = {}
local members = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
for i = 1, #members, 2 do
  local row = {members[i + 1]}
  for _, v in ipairs(cmsgpack.unpack(members[i])) do row[#row + 1] = v end
  out[#out + 1] = row
end
return out
