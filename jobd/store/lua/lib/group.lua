-- lib/group.lua: a queue's consumer group as `jobd status` and the dashboard show it (its last
-- delivered id, lag, pending entries and consumers), read in Redis at a bounded cost whatever
-- the stream holds: anyone who can write to Redis can add groups and consumers (XGROUP CREATE,
-- CREATECONSUMER, an XREADGROUP), their names of any length. XINFO GROUPS and XINFO CONSUMERS
-- have no bound of their own: Redis copies every name they answer into the script before a
-- line of it runs (16 other groups of 4 MiB names held Redis 1.1 s a read; 100 000 groups of
-- short names, 0.33 s; 16 consumers of 1 MiB names, 0.45 s). So each is asked only when what it
-- answers is known to be small:
-- - XINFO GROUPS only when the queue's group is the stream's only one (XINFO STREAM counts
--   them; XPENDING … 1 tells whether the queue's group is there): it then answers that group
--   alone, whose name is the one asked for. With other groups on the stream (someone else's,
--   of names of any size) the group is not read: its last delivered id, lag, pending count and
--   consumers are unknown (false), only its oldest pending entry is read (XPENDING … 1);
-- - XINFO CONSUMERS only when the group has ``most`` or fewer consumers and the stream's
--   MEMORY USAGE (SAMPLES 1: a walk of its groups and consumers in Redis, nothing copied; it
--   counts each consumer's name bytes) is NAMES_READ or less, so their names are too: else they
--   are counted, not listed.
-- XINFO STREAM answers the stream's first and last entries whole too: two entries, as any read
-- of an entry (the waiting tab, count_after.lua) takes them whole; jobd's own are small.
-- XPENDING … 1 answers the oldest pending entry's consumer name whole: one name.
local NAMES_READ = 1048576 -- status.CONSUMER_NAMES_READ: about 30 ms of Redis's time at most

-- The group ``group`` of stream ``key``: {1, 1, last delivered id (false: not read), lag
-- (false: Redis says null, or not read), pending entries (false: not read), the oldest pending
-- id (false: none), consumers (how many; false: not read), 1 when they are listed (0: more than
-- ``most``, names too large to read, not ``listed``, or the group not read), the stream's
-- groups (how many), then per consumer listed its name (its first ``cap`` bytes), the name's
-- length, the entries it holds, its idle ms}; {1, 0} when the stream has no such group; {0,
-- why} when the stream cannot be read (no such key, a key of another type).
local function group_read(key, group, most, cap, listed)
  local info = redis.pcall('XINFO', 'STREAM', key)
  if info.err then return {0, info.err} end
  local groups = 0
  for j = 1, #info, 2 do
    if info[j] == 'groups' then groups = info[j + 1] end
  end
  if groups == 0 then return {1, 0} end
  local first = redis.pcall('XPENDING', key, group, '-', '+', 1)
  if first.err then return {1, 0} end -- NOGROUP: the stream has no such group
  local oldest = #first > 0 and first[1][1] or false
  if groups > 1 then return {1, 1, false, false, false, oldest, false, 0, groups} end
  local f = {}
  local g = redis.call('XINFO', 'GROUPS', key)[1] -- the stream's only group: the queue's
  for j = 1, #g, 2 do f[g[j]] = g[j + 1] end
  local out = {1, 1, f['last-delivered-id'], f['lag'] or false, f['pending'], oldest,
               f['consumers'], 0, groups}
  if f['pending'] == 0 then out[6] = false end
  if listed and f['consumers'] <= most
      and redis.call('MEMORY', 'USAGE', key, 'SAMPLES', 1) <= NAMES_READ then
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
