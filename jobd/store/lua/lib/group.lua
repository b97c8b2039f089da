-- lib/group.lua: a queue's consumer group as `jobd status` and the dashboard show it (its last
-- delivered id, lag, pending entries and consumers), read in Redis at a bounded cost whatever
-- the stream holds. One rule for every read of a stream (as lib/shown.lua's for a hash): what
-- a command copies into the script is weighed in Redis first, copying nothing, and the command
-- is asked only when that weight is within a bound. Anyone who can write to Redis can add
-- entries of any size (jobd's own are up to max_payload, 16 MiB by default), groups and
-- consumers of names of any length; each reply below copies some of them whole:
-- - XINFO STREAM (the only count of the stream's groups) copies its first and last entries;
-- - XPENDING … - + 1 (the oldest pending entry) copies the consumer's name that holds it;
-- - XINFO CONSUMERS copies every consumer's name of the group;
-- - XINFO GROUPS copies every group's name, and nothing in Redis weighs a group's name.
-- The weight is the stream's MEMORY USAGE with SAMPLES 1: Redis adds, without copying any,
-- the first and the last node of entries (the first and last entries live there: XINFO
-- STREAM copies less), every group's and consumer's structures and each consumer's name (so
-- XPENDING's one name and XINFO CONSUMERS' names are less too); it walks the groups and
-- consumers, nothing else. Not a group's name: so XINFO GROUPS is asked only when every group
-- on the stream is one the config names (their names the operator's, a few bytes): XINFO
-- STREAM's count equals the config's groups on the stream that XPENDING … - + 0 finds (an
-- empty reply, no name; NOGROUP when there is no such group).
-- XINFO STREAM and XPENDING … - + 1 are asked only when the weight is within ``left`` (the
-- bytes this queue's group read may copy, status.GROUP_COPIES: 16 MiB, each queue's own),
-- XINFO CONSUMERS only within NAMES_READ and with ``most`` consumers or fewer. What the
-- script copied (the entries' and the name's bytes) is returned, for the caller to spend.
-- A stream weighing more (a backlog of about 13 000 jobs of 1 KiB, or a 16 MiB job first or
-- last) has its group's figures not read (false): the callers say "not read", never 0.
local NAMES_READ = 1048576 -- status.CONSUMER_NAMES_READ: about 30 ms of Redis's time at most

-- The group names ``spec`` holds: each as LENGTH:NAME, the queue's group first, then the
-- config's other groups on the stream (status.group_spec). nil when malformed.
local function spec_names(spec)
  local names, at = {}, 1
  while at <= #spec do
    local colon = string.find(spec, ':', at, true)
    local length = colon and tonumber(string.sub(spec, at, colon - 1))
    if not length then return nil end
    names[#names + 1] = string.sub(spec, colon + 1, colon + length)
    at = colon + length + 1
  end
  return names
end

-- Whether stream ``key`` has the group ``name`` (XPENDING … - + 0: an empty list, no name).
local function has_group(key, name)
  return not redis.pcall('XPENDING', key, name, '-', '+', 0).err
end

-- The group of stream ``key`` that ``spec`` names (spec_names): {1, 1, last delivered id,
-- lag (false: Redis says null), pending entries, the oldest pending id (false: none),
-- consumers (how many), 1 when they are listed (0: more than ``most``, names too large to
-- read, not ``listed``, or the group not read), the stream's groups (how many; false: not
-- counted), bytes copied, then per consumer listed its name (its first ``cap`` bytes), the
-- name's length, the entries it holds, its idle ms}. Each figure false when not read: the
-- last delivered id, lag, pending and consumers when the stream weighs more than ``left`` or
-- has a group the config does not name; the oldest pending id when the weight is over
-- ``left`` too. {1, 0} when the stream has no such group; {0, why} when the stream cannot be
-- read (no such key, a key of another type).
local function group_read(key, spec, most, cap, listed, left)
  local kind = redis.call('TYPE', key).ok
  if kind == 'none' then return {0, 'ERR no such key'} end
  if kind ~= 'stream' then return {0, 'WRONGTYPE the key holds a ' .. kind .. ', not a stream'} end
  local names = spec_names(spec)
  if not names or not has_group(key, names[1]) then return {1, 0} end
  local group = names[1]
  local weight = redis.call('MEMORY', 'USAGE', key, 'SAMPLES', 1)
  local out = {1, 1, false, false, false, false, false, 0, false, 0}
  if weight > left then return out end
  local info = redis.call('XINFO', 'STREAM', key)
  local groups, copied = 0, 0
  for j = 1, #info, 2 do
    if info[j] == 'groups' then groups = info[j + 1] end
    if (info[j] == 'first-entry' or info[j] == 'last-entry') and info[j + 1] then
      copied = copied + entry_cost(info[j + 1])
    end
  end
  out[9] = groups
  local first = redis.call('XPENDING', key, group, '-', '+', 1)
  if #first > 0 then
    out[6] = first[1][1]
    copied = copied + #first[1][2]
  end
  out[10] = copied
  local found = 0
  for _, name in ipairs(names) do
    if has_group(key, name) then found = found + 1 end
  end
  if groups ~= found then return out end -- a group the config does not name: not read
  local f = {}
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', key)) do
    for j = 1, #g, 2 do f[g[j]] = g[j + 1] end
    if f['name'] == group then break end
  end
  out[3], out[4], out[5], out[7] = f['last-delivered-id'], f['lag'] or false, f['pending'],
                                   f['consumers']
  if f['pending'] == 0 then out[6] = false end
  if listed and f['consumers'] <= most and weight <= NAMES_READ then
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
