-- lib/group.lua: a queue's consumer group as `jobd status` and the dashboard show it (its last
-- delivered id, lag, pending entries and consumers), read in Redis without copying any entry of
-- the stream, whatever a producer wrote there. The threat model (docs/security.md): producers
-- (anyone who can XADD) are untrusted, and entries may hold anything; groups and consumers, and
-- their names, can only be made by a client with consumer rights on the stream (XGROUP CREATE,
-- XREADGROUP, XCLAIM), who can already acknowledge, delete or destroy the queue's jobs. So no
-- reply below holds an entry, and the names they copy into the script are not weighed:
-- - XINFO GROUPS copies every group's name (their count is its length);
-- - XPENDING … - + 1 (the oldest pending entry) copies the name of the consumer holding it;
-- - XINFO CONSUMERS copies every consumer's name of the group: asked only when ``listed`` and
--   the group has ``most`` consumers or fewer, each name returned cut to ``cap`` bytes.
-- Not XINFO STREAM (its first and last entries, copied whole: a 1 000 000-field entry cost 0.9 s)
-- nor MEMORY USAGE (a weight of the whole stream: a healthy queue keeping its finished jobs for
-- retention weighed more than any bound, and its group was never read).

-- The group ``group`` of stream ``key``: {1, 1, last delivered id, lag (false: Redis says
-- null), pending entries, the oldest pending id (false: none), consumers (how many), 1 when
-- they are listed (0: more than ``most``, or not ``listed``), the stream's groups (how many),
-- the oldest pending entry's idle ms (Redis's clock since its last delivery; 0: none), the
-- stream's length (XLEN), at most how many entries wait when the lag is not known (false: it
-- is), then per consumer listed its name (its first ``cap`` bytes), the name's length, the
-- entries it holds, its idle ms}. {1, 0} when the stream has no such group; {0, why} when the stream cannot
-- be read (no such key, a key of another type).
local function group_read(key, group, most, cap, listed)
  local kind = redis.call('TYPE', key).ok
  if kind == 'none' then return {0, 'ERR no such key'} end
  if kind ~= 'stream' then return {0, 'WRONGTYPE the key holds a ' .. kind .. ', not a stream'} end
  local groups, f, added = redis.call('XINFO', 'GROUPS', key), nil, nil
  for _, g in ipairs(groups) do
    local fields = {}
    for j = 1, #g, 2 do fields[g[j]] = g[j + 1] end
    if fields['name'] == group then f = fields end
    -- A group's lag, where Redis says it, is the stream's entries-added less its entries-read.
    if fields['lag'] and fields['entries-read'] then added = fields['lag'] + fields['entries-read'] end
  end
  if not f then return {1, 0} end
  -- Redis's lag is entries-added less the group's entries-read: entries trimmed before the group
  -- read them (XADD … MAXLEN or MINID, XTRIM) stay in it for good. Past the stream's length it is
  -- surely wrong: not known (false), as a null one. (Below it, such a lag cannot be told from a
  -- true one without reading entries: an upper bound, docs/operations/observing.md.) A lag not
  -- known is never counted (that reads entries, a producer's): at most the stream's length, and
  -- at most entries-added less the group's entries-read where both are known (deleted and
  -- trimmed entries count there: an upper bound).
  local length, lag = redis.call('XLEN', key), f['lag'] or false
  if lag and lag > length then lag = false end
  local at_most = false
  if not lag then
    at_most = length
    if added and f['entries-read'] then at_most = math.min(length, added - f['entries-read']) end
  end
  local out = {1, 1, f['last-delivered-id'], lag, f['pending'], false,
               f['consumers'], 0, #groups, 0, length, at_most}
  if f['pending'] > 0 then
    local first = redis.call('XPENDING', key, group, '-', '+', 1)
    if #first > 0 then out[6], out[10] = first[1][1], first[1][3] end
  end
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
