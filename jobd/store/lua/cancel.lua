--! uses jobs.lua
-- cancel.lua: cancel jobs by job id on one stream of a queue (its own, or a priority level's).
--
-- KEYS[1]   the stream
-- KEYS[2]   the queue's cancellation marks (a sorted set scored by expiry, Redis ms)
-- KEYS[3..6] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- ARGV[1]   the consumer group
-- ARGV[2]   how long a mark lasts, ms
-- ARGV[3]   where this call's page of the pending list starts: '-', or '(' and the last id of
--           the page before
-- ARGV[4]   how many pending entries a page holds
-- ARGV[5]   the history's settings (lib/jobs.lua history_at)
-- ARGV[6]   who cancels (user@host): on the first page, each job id asked for is in the queue's
--           events (event cancel, by) in the same step as its mark; '' writes none (the
--           caller's other priority levels: the request is written once)
-- ARGV[7..] job ids (those not found running on an earlier page)
--
-- A job delivered and not settled (in the group's pending list: running, or about to start) gets
-- the mark 'id:STREAM|ENTRY' (entry ids are unique per stream only: a priority level's stream
-- may hold the same id); the daemon holding it finds the mark at its next lease renewal
-- (renew.lua) and stops the handler; the outcome is 'cancelled'. Every job id gets the mark
-- 'job:JOB_ID', which a reader finds when it reads the job (cancelled.lua) and acknowledges the
-- job unrun. A job id that is an entry of this stream not delivered yet is reported 'waiting'.
-- The pending list is walked a page per call (a dead daemon's backlog may make it long: no call
-- blocks Redis for long); the stream is never scanned.
--
-- Returns {next, rows}: next is where the following page starts, or '' after the last page;
-- rows lists {job id, 'running', consumer, entry id} for each job found running on this page,
-- and, on the last page, {job id, 'waiting', entry id} or {job id, 'marked'} for each other.
local stream, marks, group = KEYS[1], KEYS[2], ARGV[1]
if redis.call('TYPE', marks).ok ~= 'zset' then redis.call('DEL', marks) end -- someone else's
local expiry = now_ms() + tonumber(ARGV[2])
local wanted = {}
for i = 7, #ARGV do wanted[ARGV[i]] = true end
if ARGV[3] == '-' and ARGV[6] ~= '' then
  local h = history_at(3, ARGV[5])
  for i = 7, #ARGV do emit(h, 'cancel', {'job', ARGV[i], 'by', ARGV[6]}) end
end
-- The group's last delivered id: an entry after it is waiting, one before it was delivered. No
-- stream or no group yet: nothing was delivered.
local delivered, exists = '0-0', false
local groups = redis.pcall('XINFO', 'GROUPS', stream)
if type(groups) == 'table' and not groups.err then
  for _, g in ipairs(groups) do
    local name, last = nil, nil
    for i = 1, #g, 2 do
      if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then last = g[i + 1] end
    end
    if name == group then delivered, exists = last, true end
  end
end
local running, size, nxt = {}, tonumber(ARGV[4]), ''
if exists then
  local page = redis.call('XPENDING', stream, group, ARGV[3], '+', size)
  for _, p in ipairs(page) do
    local entry = redis.call('XRANGE', stream, p[1], p[1])
    if #entry == 1 then
      local jid = job_id_of(p[1], entry[1][2])
      if wanted[jid] then running[jid] = {p[1], p[2]} end
    end
  end
  if #page == size then nxt = '(' .. page[#page][1] end
end
local function after(a, b)
  local ams, aseq = string.match(a, '^(%d+)%-(%d+)$')
  local bms, bseq = string.match(b, '^(%d+)%-(%d+)$')
  if tonumber(ams) ~= tonumber(bms) then return tonumber(ams) > tonumber(bms) end
  return tonumber(aseq) > tonumber(bseq)
end
local out = {}
for i = 7, #ARGV do
  local jid = ARGV[i]
  local found = running[jid]
  if found then
    -- The job's mark too: a copy of it read later (a duplicate enqueued meanwhile) is
    -- cancelled as well; it goes with the job when the job ends (settle.lua).
    redis.call('ZADD', marks, expiry, 'job:' .. jid)
    redis.call('ZADD', marks, expiry, 'id:' .. stream .. '|' .. found[1])
    out[#out + 1] = {jid, 'running', found[2], found[1]}
  elseif nxt == '' then
    redis.call('ZADD', marks, expiry, 'job:' .. jid)
    local waiting = false
    if string.match(jid, '^%d+%-%d+$') then
      local entry = redis.call('XRANGE', stream, jid, jid)
      waiting = #entry == 1 and job_id_of(jid, entry[1][2]) == jid and after(jid, delivered)
    end
    out[#out + 1] = waiting and {jid, 'waiting', jid} or {jid, 'marked'}
  end
end
return {nxt, out}
