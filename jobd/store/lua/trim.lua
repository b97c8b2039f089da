--! uses jobs.lua
-- trim.lua: bring a stream back towards MAXLEN without removing any entry a group still needs.
--
-- KEYS[1]  the stream
-- KEYS[2]  step 2's cursor (jobd/daemon/retention.py: derive(stream, "trim")): the id of the last entry
--          step 2 looked at, so that the next call goes on from there; anything else found
--          there (another type, not an id Redis takes) is deleted and the walk starts over
-- ARGV[1]  the target length (retention.maxlen)
-- ARGV[2]  remove at most this many entries, and look at most at this many, in this call
-- ARGV[3]  milliseconds the cursor is kept (a duration)
-- ARGV[4]  the queue's consumer group (jobd's, on this stream)
--
-- Returns {removed by step 1 (XTRIM), removed by XDEL, more}: more is 1 when the call stopped at its
-- budget with the stream still above MAXLEN (another call can go on at once), else 0.
--
-- XTRIM MAXLEN ignores consumer groups (before Redis 8.2): it can remove entries that are
-- pending, or not yet delivered at all. So, for every group on the stream, jobd's or any
-- other: an entry may go only if it is below the group's last-delivered id and in no group's
-- pending list. Step 1 trims the oldest entries, bounded by the oldest pending entry and the
-- last delivered entry of every group. One long-running job would stop that bound
-- for good, so step 2 deletes, one by one, acknowledged entries further on (still below every
-- group's last-delivered id, in no pending list). Step 2 walks from its cursor, not from the
-- stream's start: however many pending entries come first (a thousand long-running jobs), each
-- call looks at the next ARGV[2] entries, and the walk starts again from the stream's start once
-- it reaches the first undelivered entry. No groups, or none of them the queue's own: nothing is
-- trimmed. The groups on the stream are all the groups there are only while jobd's is one of
-- them: without it (deleted by hand, or not made yet) its reader makes it again from the
-- stream's start at its next read, and every entry is a job jobd has not had yet, however far
-- another application's group got. No unpack: any length.
local stream, cursor_key = KEYS[1], KEYS[2]
local maxlen, budget, cursor_ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
-- Step 1 reads at most this many entries (the rest of one stream node: see there).
local READ_STEP = 100

local excess = redis.call('XLEN', stream) - maxlen
if excess <= 0 then return {0, 0, 0} end
local groups, own = {}, false
for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
  local info = {}
  for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
  groups[#groups + 1] = info
  if info['name'] == ARGV[4] then own = true end
end
if not own then return {0, 0, 0} end

-- Every group has had every entry up to `delivered` (the least last-delivered id), and none is
-- pending from `pending` on (the oldest pending entry of any group; nil: none). Ids are compared
-- as text (lib/jobs.lua id_cmp) and never stepped: no arithmetic on an id, whose parts a Lua
-- number does not hold exactly.
local delivered, pending = nil, nil
for _, g in ipairs(groups) do
  local last = g['last-delivered-id']
  if delivered == nil or id_cmp(last, delivered) < 0 then delivered = last end
  local summary = redis.call('XPENDING', stream, g['name'])
  if summary[1] > 0 and (pending == nil or id_cmp(summary[2], pending) < 0) then
    pending = summary[2]
  end
end
-- Entries up to `stop` (an XRANGE end) may go, and below `minid` whole stream nodes may.
local stop, minid = delivered, delivered
if pending and id_cmp(pending, delivered) <= 0 then stop, minid = '(' .. pending, pending end

-- Step 1: the oldest entries, up to the budget and `stop`. First whole stream nodes below
-- `minid` (XTRIM MINID ~: Redis drops a node only when its last id is below it, and LIMIT keeps
-- the count within the budget), reading no entry; then what is left of the first node: its
-- entries up to `stop`, read by XRANGE, then removed as the oldest so many (XTRIM MAXLEN =, in
-- the same step: exactly those read). A node holds at most stream-node-max-entries entries and
-- is closed past stream-node-max-bytes (4 KB by default), so this reads at most one node's
-- entries, and at most READ_STEP: never a burst of large entries (a large entry is alone in its
-- node: dropped whole unread, or at most that one read).
local want, trimmed = math.min(excess, budget), 0
if want > 0 then -- (LIMIT 0 would be no limit)
  trimmed = redis.call('XTRIM', stream, 'MINID', '~', minid, 'LIMIT', want)
end
if trimmed < want then
  local rest = redis.call('XRANGE', stream, '-', stop, 'COUNT', math.min(want - trimmed, READ_STEP))
  if #rest > 0 then
    local keep = redis.call('XLEN', stream) - #rest
    trimmed = trimmed + redis.call('XTRIM', stream, 'MAXLEN', '=', keep)
  end
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
  local scan = scan_from(delivered, budget)
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
