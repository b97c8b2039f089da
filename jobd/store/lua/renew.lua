--! uses jobs.lua workflows.lua
-- renew.lua: renew this consumer's lease on every entry it holds; report the ones it lost.
--
-- KEYS[1]   the queue's stream
-- KEYS[2]   the queue's cancellation marks (cancel.lua)
-- KEYS[3..6] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- KEYS[7..9] the queue's waiters hash, outbox and taken hash (lib/workflows.lua lost_end)
-- KEYS[10]  the queue's running set (limits.concurrency), whose slots of the entries still held
--           are renewed with them (when ARGV[3] is not 0)
-- KEYS[11..] the --unique marks of held entries (jobd/store/keys.py job_mark), referred to by
--           index from ARGV (below)
-- ARGV[1]   the consumer group
-- ARGV[2]   this consumer's name
-- ARGV[3]   the slots' lease, ms: they expire that long after now by Redis's clock (TIME),
--           one clock for every host; 0: the queue has no slots (KEYS[10] is left alone)
-- ARGV[4]   the history's settings (lib/jobs.lua history_at)
-- ARGV[5]   N: how many of the held entries' handlers told something new (below)
-- ARGV[6..5+4N] per such entry, four: its id, its job id, the fields to show in its active
--           record (a JSON object's members' text, as '"progress":42,"status":"…"'; '' when
--           none), and its deadline in ms after its start (what it extended it to, as the daemon
--           enforces it; '' when none)
-- ARGV[6+4N] M: how many entries this consumer believes it holds
-- ARGV[7+4N..6+4N+M] their ids
-- ARGV[7+4N+M..6+4N+2M] their job ids, in the same order ('' or none: not known): a job whose
--           entry was deleted is recorded under it (lib/workflows.lua lost_end)
-- ARGV[7+4N+2M..6+4N+3M] the index in KEYS of each one's --unique mark (0 or none: none): a
--           job whose entry was deleted frees its job id (lost_end: a mark saying 'queued' goes)
--
-- Returns {lost, cancelled, shown}: lost is a flat list of pairs for the entries it no longer holds:
-- id, owner now ('' when no one: acknowledged, its data trimmed, or handed back); cancelled
-- lists the entries it renewed that `jobd cancel` marked ('id:STREAM|ENTRY'): the daemon stops their
-- handlers (the heartbeat's reply carries the cancellation, so it reaches any host, through a
-- cluster or Sentinel, with no pub/sub); shown lists the entries whose told fields were written. The marks stay until the outcome is written. An entry
-- lost to another consumer is in the job's history and the queue's events ('lease lost', owner)
-- in the same step; one deleted, 'lost' (below); not one this consumer handed back itself, nor
-- one pending nowhere: settled, by its own outcome most likely, since the caller listed it.
--
-- Redis counts an entry's idle time from its last delivery or claim. XCLAIM with min-idle 0 and
-- JUSTID resets that time without counting a delivery; but min-idle 0 also takes an entry from
-- whoever holds it, so ownership is checked first, in this same script: no window between the
-- two. The check reads this consumer's own pending list (XPENDING … consumer) once, so a tick
-- costs a few commands however many entries are in flight; only lost entries are looked up one
-- by one, for their new owner. On Redis 7.0+ XCLAIM drops (and does not return) entries whose
-- data was deleted, and takes them out of the group: those are lost too, and as this step took
-- them out, it records each job's end, 'lost', and tells it to its batch and waiters
-- (lib/workflows.lua lost_end), once (no later call, and no reclaim, finds them pending). On 6.2
-- XCLAIM … JUSTID keeps them: the handler goes on, and its outcome is written as any.
--
-- An entry handed back (settle.lua 'back': its last delivery set to 1970) is no longer held
-- although it is still in this consumer's pending list: renewing it would reset its idle time
-- and re-add its slot, and the job would wait a whole reclaim_after instead of being taken at
-- once. It is recognised by an idle time no lease reaches (HANDED_BACK) and reported lost.
local stream, group, me = KEYS[1], ARGV[1], ARGV[2]
-- This consumer's own pending list, page by page: a few commands however many entries it holds.
local held, start = {}, '-'
while true do
  local page = redis.call('XPENDING', stream, group, start, '+', 1000, me)
  for _, p in ipairs(page) do held[p[1]] = p[3] < HANDED_BACK end
  if #page < 1000 then break end
  start = '(' .. page[#page][1]
end
local lost, mine, h, deleted = {}, {}, nil, {}
-- The job's history and the queue's events: this consumer's attempt of entry ``id`` ended here,
-- the entry taken over by ``owner`` (whose active record of the job it is now, maybe).
local function lost_to(id, owner)
  h = h or history_at(3, ARGV[4])
  local entry = redis.call('XRANGE', stream, id, id)
  local job = #entry == 1 and job_id_of(id, entry[1][2]) or id
  local batch, incarnation -- its batch link (lib/jobs.lua linked); none when its data is gone
  if #entry == 1 then batch, incarnation = batch_in(entry[1][2]) end
  local record = cjson.encode({event = 'lease lost', stream = stream, entry = id, consumer = me,
    owner = owner})
  remember(h, linked({event = 'lease lost', job = job, record = record,
    extras = {'consumer', me, 'owner', owner}}, batch, incarnation), now_ms(), id)
end
local told = tonumber(ARGV[5])
local first, count = 7 + 4 * told, tonumber(ARGV[6 + 4 * told])
local known, uniques = {}, {} -- the job ids and --unique marks the caller sent, by entry
for i = first, first + count - 1 do
  local job, mark = ARGV[i + count], tonumber(ARGV[i + 2 * count])
  if job and job ~= '' then known[stream .. '|' .. ARGV[i]] = job end
  if mark and mark > 0 then uniques[stream .. '|' .. ARGV[i]] = KEYS[mark] end
end
for i = first, first + count - 1 do
  local id = ARGV[i]
  if held[id] then
    mine[#mine + 1] = id
  elseif held[id] == false then -- handed back: still listed as this consumer's, held by no one
    lost[#lost + 1] = id
    lost[#lost + 1] = ''
  else
    local p = redis.call('XPENDING', stream, group, id, id, 1)
    lost[#lost + 1] = id
    lost[#lost + 1] = (#p == 0) and '' or p[1][2]
    -- Pending nowhere: settled, most likely by this consumer's own outcome written since the
    -- caller listed its entries (or acked by hand): no lease was lost to anyone, no record.
    if #p == 1 then lost_to(id, p[1][2]) end
  end
end
local expiry = 0
local slots = tonumber(ARGV[3]) > 0 and KEYS[10] or nil
if slots then -- someone else's key there takes no slot: the renewals (written above) must
  local t = redis.call('TYPE', slots).ok -- not end in an error that hides the leases lost
  if t ~= 'zset' and t ~= 'none' then slots = nil end
end
if slots then
  local t = redis.call('TIME')
  expiry = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[3])
end
local CHUNK = 1000
local renewed = {}
for first = 1, #mine, CHUNK do
  local args = {stream, group, me, '0'}
  local last = math.min(first + CHUNK - 1, #mine)
  for i = first, last do args[#args + 1] = mine[i] end
  args[#args + 1] = 'JUSTID'
  local kept = {}
  for _, id in ipairs(redis.call('XCLAIM', unpack(args))) do kept[id] = true end
  for i = first, last do
    if not kept[mine[i]] then -- deleted: taken out of the group by this XCLAIM (above)
      lost[#lost + 1] = mine[i]
      lost[#lost + 1] = ''
      deleted[#deleted + 1] = mine[i]
    else
      renewed[mine[i]] = true
      if slots then redis.call('ZADD', slots, expiry, me .. '|' .. stream .. '|' .. mine[i]) end
    end
  end
end
if #deleted > 0 then
  h = h or history_at(3, ARGV[4])
  lost_held(h, workflow_at(7, h.queue), taken_at(9), stream, deleted, known, me,
    marks_of(KEYS[2]), uniques)
end
-- A marks key of another type (someone else's) is no mark: the renewal itself must go on. Only
-- the entries renewed: one deleted is reported lost (above), once, its marks gone with its end.
local cancelled = {}
if redis.call('TYPE', KEYS[2]).ok == 'zset' then
  for _, id in ipairs(mine) do
    if renewed[id] and redis.call('ZSCORE', KEYS[2], 'id:' .. stream .. '|' .. id) then
      cancelled[#cancelled + 1] = id
    end
  end
end
-- What handlers told of themselves (progress, status, the deadline they extended; lease.py)
-- goes into their jobs' active
-- records: only for entries renewed here (a handler whose lease was lost changes nothing of the
-- new owner's), and only into this consumer's record of this very entry ("STREAM|ENTRY\n"
-- first, "consumer" this one; none yet: the daemon sends it again). The record of the same
-- entry by its previous holder (taken over from it, and this consumer's own record not written
-- yet) is not this one's: written there, what the new handler told was shown as the old
-- holder's, then lost when start.lua replaced the record, and never sent again. The fields come
-- first in the record, before "since" (start.lua), and replace those told before: a '"since":'
-- outside a JSON string is that key's (a quote in a string is escaped), so what follows it is
-- the record as start.lua wrote it, '"since":S,"deadline":D,' first: a deadline told makes D
-- since plus it (on Redis's clock, as start.lua's: the daemon sends it from the start).
local function mine_to_tell(value, prefix)
  if string.sub(value, 1, #prefix) ~= prefix then return false end
  local ok, record = pcall(cjson.decode, string.sub(value, #prefix + 1))
  return ok and type(record) == 'table' and record.consumer == me
end
local shown = {}
local t = told > 0 and redis.call('TYPE', KEYS[5]).ok
for i = 6, 5 + 4 * told, 4 do
  local id, job, fields, deadline = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local prefix = stream .. '|' .. id .. '\n'
  local value = renewed[id] and t == 'hash' and redis.call('HGET', KEYS[5], job)
  if value and mine_to_tell(value, prefix) then
    local at = string.find(value, '"since":', #prefix + 1, true)
    if at then
      local rest = string.sub(value, at)
      local since, after = string.match(rest, '^"since":(%d+),"deadline":%d+(,.*)$')
      if since and deadline ~= '' then
        rest = string.format('"since":%s,"deadline":%d%s', since,
          tonumber(since) + tonumber(deadline), after)
      end
      local sep = fields == '' and '' or ','
      redis.call('HSET', KEYS[5], job, prefix .. '{' .. fields .. sep .. rest)
      shown[#shown + 1] = id
    end
  end
end
return {lost, cancelled, shown}
