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
-- Returns {removed by step 1 (XTRIM), removed by XDEL, more}: more is 1 when the call stopped at
-- its budget (entries or bytes) with the stream still above MAXLEN (another call can go on at
-- once), else 0.
--
-- XTRIM MAXLEN ignores consumer groups (before Redis 8.2): it can remove entries that are
-- pending, or not yet delivered at all. So, for every group on the stream (jobd's, another
-- queue's of the config, anyone's): an entry may go only if it is below the group's
-- last-delivered id and in no group's pending list. Step 1 trims the oldest entries, bounded by
-- the oldest pending entry and the last delivered entry of every group. One long-running job
-- would stop that bound for good, so step 2 deletes, one by one, acknowledged entries further on
-- (still below every group's last-delivered id, in no pending list: never the entry at a
-- group's last-delivered id, which XDEL would leave as a tombstone at or after it, and Redis then
-- answers that group's lag as null, XINFO GROUPS, until it reads past it: status would have to
-- read entries to count it; XTRIM leaves no tombstone). Step 2 walks from its
-- cursor, not from the stream's start: however many pending entries come first (a thousand
-- long-running jobs), each call goes ARGV[2] entries further at most, and the walk starts again
-- from the stream's start once it reaches the first undelivered entry.
--
-- What it reads, under the threat model of docs/security.md (as lib/group.lua):
-- - entries (anyone who can XADD writes them: untrusted, any size, any number of fields): none
--   is copied to read the groups (no XINFO STREAM, which copies the first and last entries
--   whole: one of 1 000 000 fields cost 0.22 s a call). Step 1 reads at most READ_STEP entries
--   (the rest of one stream node); step 2 never reads a pending entry (their ids come from
--   XPENDING on the range, per group) and reads the acknowledged ones one at a time, each
--   deleted once read, READ_BYTES at most a call (one entry at least): what it reads is what it
--   deletes. The consumers' names XPENDING answers (one per pending entry found) count in those
--   bytes too. No unpack: any length.
-- - groups: every group on the stream, from XINFO GROUPS (their count is its length), each name
--   sent back in XPENDING. Groups and their names are consumer-role data (XGROUP CREATE: a
--   daemon, an operator), whose read cost is not bounded here.
-- No groups, or none of them the queue's own: nothing is trimmed. The groups on the stream are all
-- the groups there are only while jobd's is one of them: without it (deleted by hand, or not made
-- yet) its reader makes it again from the stream's start at its next read, and every entry is a
-- job jobd has not had yet, however far another application's group got.
local stream, cursor_key = KEYS[1], KEYS[2]
local maxlen, budget, cursor_ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
-- Step 1 reads at most this many entries (the rest of one stream node: see there).
local READ_STEP = 100
-- Step 2 reads at most this many bytes of entries a call (ids, field names and values), or one.
local READ_BYTES = 4194304 -- retention.READ_BYTES

local excess = redis.call('XLEN', stream) - maxlen
if excess <= 0 then return {0, 0, 0} end

-- Every group has had every entry up to `delivered` (the least last-delivered id), and none is
-- pending from `pending` on (the oldest pending entry of any group; nil: none). Ids are compared
-- as text (lib/jobs.lua id_cmp) and never stepped: no arithmetic on an id, whose parts a Lua
-- number does not hold exactly. `holding`: the groups with entries pending, for step 2 (the
-- others have none in this script either).
local delivered, pending, read, holding, ours = nil, nil, 0, {}, false
for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
  local f = {}
  for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
  if f['name'] == ARGV[4] then ours = true end
  if delivered == nil or id_cmp(f['last-delivered-id'], delivered) < 0 then
    delivered = f['last-delivered-id']
  end
  if f['pending'] > 0 then
    holding[#holding + 1] = f['name']
    local oldest = redis.call('XPENDING', stream, f['name'], '-', '+', 1)
    if #oldest > 0 then
      read = read + #oldest[1][2] -- the consumer's name, copied
      if pending == nil or id_cmp(oldest[1][1], pending) < 0 then pending = oldest[1][1] end
    end
  end
end
if not ours then return {0, 0, 0} end
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
-- Where the walk starts: just past the cursor. A cursor that is not an id Redis takes (another
-- type: WRONGTYPE; not an id; an id out of range, e.g. 99999999999999999999-0; the largest id,
-- which has no next) is deleted and the walk starts from the stream's start: never trust what
-- another client may have written, and never let it stop retention for good.
local function walk_start()
  local cursor = redis.pcall('GET', cursor_key)
  if type(cursor) == 'string' and string.match(cursor, '^%d+%-%d+$') then
    -- (COUNT 0: no entry read; Redis answers null, or an error for an id it does not take)
    local probe = redis.pcall('XRANGE', stream, '(' .. cursor, '+', 'COUNT', 0)
    if not (type(probe) == 'table' and probe.err) then return '(' .. cursor end
  end
  if cursor then redis.call('DEL', cursor_key) end
  return '-'
end
-- The first id after `from` (an XRANGE start) up to `delivered` pending in any group,
-- or nil: XPENDING answers ids (and a consumer's name, counted in `read`), never an entry.
local function next_pending(from)
  local found = nil
  for _, g in ipairs(holding) do
    local p = redis.pcall('XPENDING', stream, g, from, delivered, 1)
    if not p.err and #p > 0 then
      read = read + #p[1][2]
      if found == nil or id_cmp(p[1][1], found) < 0 then found = p[1][1] end
    end
  end
  return found
end
-- What reading entry ``row`` ({id, {field, value, …}}) cost, in bytes: its id, each field's
-- name and value, and FIELD_COST a field (lib/shown.lua's: an entry of many empty fields costs
-- Redis a Lua string each).
local FIELD_COST = 64
local function weight(row)
  local size = #row[1]
  for i = 1, #row[2], 2 do size = size + #row[2][i] + #(row[2][i + 1] or '') + FIELD_COST end
  return size
end

local deleted, more, looked = 0, 0, 0
excess = excess - trimmed
budget = budget - trimmed
if excess > 0 and budget > 0 then
  local from, last, ended = walk_start(), nil, false
  local function stopped() return deleted >= excess or looked >= budget or read >= READ_BYTES end
  while not stopped() do
    local p = next_pending(from)
    local upto = '(' .. (p or delivered) -- below it: never the last delivered entry
    while not stopped() do -- the acknowledged entries before it: each read, then deleted
      local e = redis.pcall('XRANGE', stream, from, upto, 'COUNT', 1)
      if e.err or #e == 0 then break end
      looked, read = looked + 1, read + weight(e[1])
      deleted = deleted + redis.call('XDEL', stream, e[1][1])
      last, from = e[1][1], '(' .. e[1][1]
    end
    if stopped() then break end
    if p == nil then ended = true break end
    looked, last, from = looked + 1, p, '(' .. p -- the pending one: not read
  end
  if ended then
    redis.call('DEL', cursor_key) -- reached the first undelivered entry: next walk from the start
  else
    if last then redis.call('SET', cursor_key, last, 'PX', cursor_ttl) end
    if deleted < excess then more = 1 end
  end
elseif excess > 0 then
  more = 1
end
return {trimmed, deleted, more}
