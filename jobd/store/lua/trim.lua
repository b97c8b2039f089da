-- trim.lua: bring a stream back towards MAXLEN without removing any entry a group still needs.
--
-- KEYS[1]  the stream
-- KEYS[2]  step 2's cursor (jobd/daemon/retention.py: derive(stream, "trim")): the id of the last entry
--          step 2 looked at, so that the next call goes on from there; anything else found
--          there (another type, not an id Redis takes) is deleted and the walk starts over
-- ARGV[1]  the target length (retention.maxlen)
-- ARGV[2]  remove at most this many entries, and look at most at this many, in this call
-- ARGV[3]  milliseconds the cursor is kept (a duration)
--
-- Returns {removed by XTRIM MINID, removed by XDEL, more}: more is 1 when the call stopped at its
-- budget with the stream still above MAXLEN (another call can go on at once), else 0.
--
-- XTRIM MAXLEN ignores consumer groups (before Redis 8.2): it can remove entries that are
-- pending, or not yet delivered at all. So, for every group on the stream, jobd's or any
-- other: an entry may go only if it is below the group's last-delivered id and in no group's
-- pending list. Step 1 trims the oldest entries with MINID, bounded by the oldest pending entry
-- and the first undelivered entry of every group. One long-running job would stop that bound
-- for good, so step 2 deletes, one by one, acknowledged entries further on (still below every
-- group's last-delivered id, in no pending list). Step 2 walks from its cursor, not from the
-- stream's start: however many pending entries come first (a thousand long-running jobs), each
-- call looks at the next ARGV[2] entries, and the walk starts again from the stream's start once
-- it reaches the first undelivered entry. No groups: nothing is trimmed. No unpack: any length.
local stream, cursor_key = KEYS[1], KEYS[2]
local maxlen, budget, cursor_ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]

local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function less(a, b)
  local ams, aseq = parse(a)
  local bms, bseq = parse(b)
  return ams < bms or (ams == bms and aseq < bseq)
end
local function after(id)
  local ms, seq = parse(id)
  return string.format('%d-%d', ms, seq + 1)
end

local excess = redis.call('XLEN', stream) - maxlen
if excess <= 0 then return {0, 0, 0} end
local groups = {}
for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
  local info = {}
  for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
  groups[#groups + 1] = info
end
if #groups == 0 then return {0, 0, 0} end

-- Below `delivered` every group has had every entry; below `safe` none is pending either.
local delivered, safe = nil, nil
for _, g in ipairs(groups) do
  local next_undelivered = after(g['last-delivered-id'])
  if delivered == nil or less(next_undelivered, delivered) then delivered = next_undelivered end
  local bound = next_undelivered
  local summary = redis.call('XPENDING', stream, g['name'])
  if summary[1] > 0 and less(summary[2], bound) then bound = summary[2] end
  if safe == nil or less(bound, safe) then safe = bound end
end

-- Step 1: the oldest entries, up to the budget and the safe bound.
local oldest = redis.call('XRANGE', stream, '-', '+', 'COUNT', math.min(excess, budget))
local trimmed = 0
if #oldest > 0 then
  local cut = after(oldest[#oldest][1])
  if less(safe, cut) then cut = safe end
  trimmed = redis.call('XTRIM', stream, 'MINID', cut)
end

-- Step 2: acknowledged entries behind a long-pending one, from the cursor on.
local function pending_anywhere(id)
  for _, g in ipairs(groups) do
    if #redis.call('XPENDING', stream, g['name'], id, id, 1) > 0 then return true end
  end
  return false
end
-- The entries to look at, from the cursor on. A cursor that is not an id Redis takes (another
-- type: WRONGTYPE; not an id; an id out of range, e.g. 99999999999999999999-0; the largest id,
-- which has no next) is deleted and the walk starts from the stream's start: never trust what
-- another client may have written, and never let it stop retention for good.
local function scan_from(stop, count)
  local cursor = redis.pcall('GET', cursor_key)
  if type(cursor) == 'string' and string.match(cursor, '^%d+%-%d+$') then
    local scan = redis.pcall('XRANGE', stream, '(' .. cursor, stop, 'COUNT', count)
    if not scan.err then return scan end
  end
  if cursor then redis.call('DEL', cursor_key) end
  return redis.call('XRANGE', stream, '-', stop, 'COUNT', count)
end

local deleted, more = 0, 0
excess = excess - trimmed
budget = budget - trimmed
if excess > 0 and budget > 0 then
  local scan = scan_from('(' .. delivered, budget)
  local looked = 0
  for _, entry in ipairs(scan) do
    if deleted >= excess then break end
    looked = looked + 1
    if not pending_anywhere(entry[1]) then
      deleted = deleted + redis.call('XDEL', stream, entry[1])
    end
  end
  if looked < #scan or #scan == budget then
    redis.call('SET', cursor_key, scan[looked][1], 'PX', cursor_ttl)
    if deleted < excess then more = 1 end
  else
    redis.call('DEL', cursor_key)  -- reached the first undelivered entry: next walk from the start
  end
elseif excess > 0 then
  more = 1
end
return {trimmed, deleted, more}
