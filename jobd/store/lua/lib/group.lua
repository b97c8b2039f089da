-- lib/group.lua: a queue's consumer group as `jobd status` and the dashboard show it (its last
-- delivered id, lag, pending entries and consumers), read in Redis to a bound whatever the
-- stream holds: anyone who can write to Redis can add groups and consumers (XGROUP CREATE,
-- CREATECONSUMER, an XREADGROUP), their names of any length. XINFO GROUPS and XINFO CONSUMERS
-- have no bound of their own, so what they answer stays in the script: only the group asked
-- for leaves Redis, and its consumers only when there are ``most`` or fewer (XINFO GROUPS says
-- how many first), each name cut to ``cap`` bytes.

-- The group ``group`` of stream ``key``: {1, 1, last delivered id, lag (false: Redis says
-- null), pending entries, the oldest pending id (false: none), consumers (how many), 1 when
-- they are listed (0: more than ``most``, or not ``listed``), then per consumer listed its name
-- (its first ``cap`` bytes), the name's length, the entries it holds, its idle ms}; {1, 0}
-- when the stream has no such group; {0, why} when the stream cannot be read (no such key, a
-- key of another type).
local function group_read(key, group, most, cap, listed)
  local groups = redis.pcall('XINFO', 'GROUPS', key)
  if groups.err then return {0, groups.err} end
  for _, g in ipairs(groups) do
    local f = {}
    for j = 1, #g, 2 do f[g[j]] = g[j + 1] end
    if f['name'] == group then
      local oldest = false
      if f['pending'] > 0 then
        local first = redis.call('XPENDING', key, group, '-', '+', 1)
        if #first > 0 then oldest = first[1][1] end
      end
      local out = {1, 1, f['last-delivered-id'], f['lag'] or false, f['pending'], oldest,
                   f['consumers'], 0}
      if listed and f['consumers'] <= most then
        out[8] = 1
        for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', key, group)) do
          local cf = {}
          for j = 1, #c, 2 do cf[c[j]] = c[j + 1] end
          out[#out + 1] = string.sub(cf['name'], 1, cap)
          out[#out + 1] = #cf['name']
          out[#out + 1] = cf['pending']
          out[#out + 1] = cf['idle']
        end
      end
      return out
    end
  end
  return {1, 0}
end
