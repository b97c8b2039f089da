--! uses jobs.lua
-- renew.lua: renew this consumer's lease on every entry it holds; report the ones it lost.
--
-- KEYS[1]   the queue's stream
-- KEYS[2]   the queue's cancellation marks (cancel.lua)
-- KEYS[3..6] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- KEYS[7]   optional: the queue's running set (limits.concurrency), whose slots of the entries
--           still held are renewed with them
-- ARGV[1]   the consumer group
-- ARGV[2]   this consumer's name
-- ARGV[3]   the slots' lease, ms: they expire that long after now by Redis's clock (TIME),
--           one clock for every host (ignored without KEYS[7])
-- ARGV[4]   the history's settings (lib/jobs.lua history_at)
-- ARGV[5..] ids of the entries this consumer believes it holds
--
-- Returns {lost, cancelled}: lost is a flat list of pairs for the entries it no longer holds:
-- id, owner now ('' when no one: acknowledged, its data trimmed, or handed back); cancelled
-- lists the entries it holds that `jobd cancel` marked ('id:STREAM|ENTRY'): the daemon stops their
-- handlers (the heartbeat's reply carries the cancellation, so it reaches any host, through a
-- cluster or Sentinel, with no pub/sub). The marks stay until the outcome is written. An entry
-- lost to another consumer, or gone, is in the job's history and the queue's events ('lease
-- lost', owner) in the same step (not one this consumer handed back itself, nor one pending
-- nowhere: settled, by its own outcome most likely, since the caller listed it).
--
-- Redis counts an entry's idle time from its last delivery or claim. XCLAIM with min-idle 0 and
-- JUSTID resets that time without counting a delivery; but min-idle 0 also takes an entry from
-- whoever holds it, so ownership is checked first, in this same script: no window between the
-- two. The check reads this consumer's own pending list (XPENDING … consumer) once, so a tick
-- costs a few commands however many entries are in flight; only lost entries are looked up one
-- by one, for their new owner. On Redis 7.0+ XCLAIM drops (and does not return) entries whose
-- data was deleted: those are lost too.
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
local lost, mine, h = {}, {}, nil
-- The job's history and the queue's events: this consumer's attempt of entry ``id`` ended here.
local function lost_to(id, owner)
  h = h or history_at(3, ARGV[4])
  local entry = redis.call('XRANGE', stream, id, id)
  local job = #entry == 1 and job_id_of(id, entry[1][2]) or id
  if owner == '' then not_running(h, job, stream, id) end -- else the active record may be theirs
  local record = cjson.encode({event = 'lease lost', stream = stream, entry = id, consumer = me,
    owner = owner})
  remember(h, {event = 'lease lost', job = job, record = record,
    extras = {'consumer', me, 'owner', owner}}, now_ms(), id)
end
for i = 5, #ARGV do
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
if KEYS[7] then
  local t = redis.call('TIME')
  expiry = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[3])
end
local CHUNK = 1000
for first = 1, #mine, CHUNK do
  local args = {stream, group, me, '0'}
  local last = math.min(first + CHUNK - 1, #mine)
  for i = first, last do args[#args + 1] = mine[i] end
  args[#args + 1] = 'JUSTID'
  local kept = {}
  for _, id in ipairs(redis.call('XCLAIM', unpack(args))) do kept[id] = true end
  for i = first, last do
    if not kept[mine[i]] then
      lost[#lost + 1] = mine[i]
      lost[#lost + 1] = ''
      lost_to(mine[i], '')
    elseif KEYS[7] then
      redis.call('ZADD', KEYS[7], expiry, me .. '|' .. stream .. '|' .. mine[i])
    end
  end
end
-- A marks key of another type (someone else's) is no mark: the renewal itself must go on.
local cancelled = {}
if redis.call('TYPE', KEYS[2]).ok == 'zset' then
  for _, id in ipairs(mine) do
    if redis.call('ZSCORE', KEYS[2], 'id:' .. stream .. '|' .. id) then
      cancelled[#cancelled + 1] = id
    end
  end
end
return {lost, cancelled}
