--! uses jobs.lua workflows.lua
-- reclaim.lua: take over entries whose lease lapsed (idle at least min-idle), one XAUTOCLAIM step.
--
-- KEYS[1]  the queue's stream
-- KEYS[2..5] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- KEYS[6..8] the queue's waiters hash, outbox and taken hash (lib/workflows.lua lost_end)
-- KEYS[9]  the queue's cancellation marks (cancel.lua): a deleted entry's go with its end
-- ARGV[1]  the consumer group
-- ARGV[2]  this consumer's name
-- ARGV[3]  min-idle in milliseconds (the queue's lease.reclaim_after)
-- ARGV[4]  cursor to start from ('0-0' at first)
-- ARGV[5]  at most this many entries (this daemon's free slots)
-- ARGV[6]  the history's settings (lib/jobs.lua history_at)
-- ARGV[7]  the most bytes an entry's fields may hold to be returned as they are, or 0 for any:
--          a larger entry is claimed but returned as a stand-in (lib/jobs.lua sized), as
--          read_levels.lua does
-- ARGV[8..] entries this consumer handed back whose hand-back it has not seen answered (Redis
--          was away): one still this consumer's and not handed back (not idle for decades)
--          never got its hand-back, and its claim here is that hand-back's claim too: the
--          delivery it counts is taken back in the same step, as the hand-back would have
--          (settle.lua 'back'), so a hand-back kept through an outage longer than reclaim_after
--          costs no delivery toward max_deliveries. (The hand-back itself, sent again later,
--          finds the entry delivered since and leaves it alone.)
--
-- Returns {next cursor, {{id, {field, value, …}, times delivered, handed back: 1 or 0}, …},
-- {deleted id, …}, {job id, …}}: the last, the --unique jobs among the deleted ones (known by
-- their taken records: lib/workflows.lua take_note), whose 'queued' marks the caller deletes in
-- a call of its own (lost_marks.lua): this script is not sent their keys.
-- The caller follows the cursor until it is '0-0': XAUTOCLAIM scans at most COUNT×10 pending
-- entries per call and may claim nothing yet return a non-zero cursor. The delivery count is
-- read in the same script, after the claim counted this delivery: it is what the poison check
-- (max_deliveries) needs. Redis 7.0+ purges pending entries whose data was deleted and lists
-- them third; 6.2 claims them and replies a null for each (its id found below): they are
-- acknowledged here, as nothing is left to run.
-- Either way their jobs' active records (of a daemon that died) are removed, and each job's end,
-- 'lost', is recorded and told to its batch and waiters (lib/workflows.lua lost_end): this step
-- is the one that takes the entry out of the group, so it is told once.
-- Each entry claimed is in its job's history and the queue's events ('reclaimed', deliveries) in
-- the same step, and a workflow or --unique job's is in the taken hash (lib/workflows.lua
-- take_note: a waiter may have come since its first read).
local stream, group, me = KEYS[1], ARGV[1], ARGV[2]
local unanswered = {}
for i = 8, #ARGV do
  local p = redis.call('XPENDING', stream, group, ARGV[i], ARGV[i], 1)
  if #p == 1 and p[1][2] == me and tonumber(p[1][3]) < HANDED_BACK then
    unanswered[ARGV[i]] = true
  end
end
-- Entries handed back (settle.lua 'back': idle since 1970) are picked up again, not taken over
-- from a lapsed lease: each claimed one is flagged so (the caller logs it as such). XAUTOCLAIM
-- looks at most at ARGV[5] × 10 entries of the pending list from the cursor on, so those are
-- the ones read here (their rows only, in the same order), before the claim makes them idle no
-- more: a bounded read, where XPENDING … IDLE walks the whole rest of the list when few match.
local back, rows = {}, redis.call('XPENDING', stream, group, ARGV[4], '+', 10 * tonumber(ARGV[5]))
for _, p in ipairs(rows) do
  if tonumber(p[3]) >= HANDED_BACK then back[p[1]] = true end
end
local reply = redis.call('XAUTOCLAIM', stream, group, me, ARGV[3], ARGV[4], 'COUNT', ARGV[5])
-- Redis 6.2 replies a null (Lua: false) in place of a claimed entry whose data was deleted, not
-- its id (7.0+ purges it and lists its id third). Its id is the first of ``rows`` (the pending
-- rows read above, in the order XAUTOCLAIM walks them) after the entry before it in the reply
-- that this claim took: this consumer's now, its delivery count one more than read above (an
-- entry XAUTOCLAIM passes over is left as it was). By position in the reply; nil: not found.
local function null_ids(entries)
  local ids, r = {}, 1
  for i, entry in ipairs(entries) do
    if type(entry) == 'table' then
      while r <= #rows and rows[r][1] ~= entry[1] do r = r + 1 end
      r = r + 1
    else
      while r <= #rows and not ids[i] do
        local row = rows[r]
        local p = redis.call('XPENDING', stream, group, row[1], row[1], 1)[1]
        if p and p[2] == me and tonumber(p[4]) > tonumber(row[4]) then ids[i] = row[1] end
        r = r + 1
      end
    end
  end
  return ids
end
local nulls = {}
for _, entry in ipairs(reply[2]) do
  if type(entry) ~= 'table' then nulls = null_ids(reply[2]); break end
end
local claimed, deleted, h = {}, reply[3] or {}, nil
local taken, waiters = taken_at(8), nil
if #reply[2] > 0 then waiters = redis.call('TYPE', KEYS[6]).ok == 'hash' and KEYS[6] or nil end
for i, entry in ipairs(reply[2]) do
  local id, fields = nulls[i], nil
  if type(entry) == 'table' then id, fields = entry[1], entry[2] end
  if type(fields) ~= 'table' then
    if id then
      redis.call('XACK', stream, group, id)
      deleted[#deleted + 1] = id
    end
  else
    local p = redis.call('XPENDING', stream, group, id, id, 1)
    if unanswered[id] then
      p[1][4] = math.max(tonumber(p[1][4]) - 1, 1)
      redis.call('XCLAIM', stream, group, me, '0', id, 'RETRYCOUNT', p[1][4], 'JUSTID')
    end
    claimed[#claimed + 1] = {id, sized(fields, tonumber(ARGV[7])), p[1][4],
      (back[id] or unanswered[id]) and 1 or 0}
    h = h or history_at(2, ARGV[6])
    take_note(taken, waiters, group, stream, id, fields)
    local job = job_id_of(id, fields)
    local record = cjson.encode({event = 'reclaimed', stream = stream, entry = id, consumer = me,
      deliveries = p[1][4]})
    remember(h, linked({event = 'reclaimed', job = job, record = record,
      extras = {'consumer', me, 'deliveries', tostring(p[1][4])}}, batch_in(fields)), now_ms(), id)
  end
end
-- A deleted entry's job runs nowhere: its active record (of a daemon that died) goes too, and
-- its end is told.
local unfreed = {}
if #deleted > 0 then
  h = h or history_at(2, ARGV[6])
  local now = now_ms()
  unfreed = lost_end(h, workflow_at(6, h.queue), taken, stream, deleted, gone_not_running(h, stream, deleted),
    me, now, marks_of(KEYS[9]), {})
  trim_history(h, now)
end
return {reply[1], claimed, deleted, unfreed}
