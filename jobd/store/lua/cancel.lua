--! uses jobs.lua
-- cancel.lua: cancel jobs by job id on one stream of a queue (its own, or a priority level's).
--
-- KEYS[1]   the stream
-- KEYS[2]   the queue's cancellation marks (a sorted set; lib/jobs.lua HELD)
-- KEYS[3..6] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- KEYS[7]   the queue's cancel generation (a string readers poll with the pause: a change
--           makes each reader ask at once whether an entry its daemon holds is cancelled)
-- ARGV[1]   the consumer group
-- ARGV[2]   how long the mark of a job found nowhere lasts, ms (jobd cancel --unseen-for)
-- ARGV[3]   where this call's page of the pending list starts: '-', or '(' and the last id of
--           the page before
-- ARGV[4]   how many pending entries a page holds
-- ARGV[5]   the history's settings (lib/jobs.lua history_at)
-- ARGV[6]   who cancels (user@host): on the first page, each job id asked for is in the queue's
--           events (event cancel, by) in the same step as its mark; '' writes none (the
--           caller's other priority levels: the request is written once)
-- ARGV[7..] job ids
--
-- Every entry of a job id delivered and not settled (in the group's pending list: running, or
-- about to start; a producer may have sent the job twice) gets the mark 'id:STREAM|ENTRY'
-- (entry ids are unique per stream only: a priority level's stream may hold the same id),
-- held until the entry is settled (scored HELD: no expiry); the generation changes, the daemon
-- holding it learns of it at its reader's next poll (or its next lease renewal, renew.lua) and
-- stops the handler; the outcome is 'cancelled'. A daemon that died holding it never runs it
-- again: whoever takes it over acks it unrun (cancelled.lua). A job id that is an entry of this
-- stream not delivered yet is reported 'waiting' and gets the same held mark: it is
-- acknowledged unrun whenever it is read (the other waiting entries of a job id are
-- cancel_waiting.lua's). On the first page every job id also gets the mark 'job:JOB_ID', for
-- ARGV[2]: a reader acknowledges unrun a job of that id it reads meanwhile (cancelled.lua); it
-- goes with the first entry of the id settled (settle.lua). The pending list is walked a page
-- per call, every page for every job id (a dead daemon's backlog may make it long: no call
-- blocks Redis for long); the stream is never scanned. Each first call also removes a few held
-- marks whose entry is gone (lib/jobs.lua sweep_held). Every call that may fail comes before
-- the first write.
--
-- Returns {next, rows}: next is where the following page starts, or '' after the last page;
-- rows lists {job id, 'running', consumer, entry id} for each entry of a job id found running
-- on this page, and, on the last page, {job id, 'waiting', entry id} or, for a job id this page
-- found in neither place, {job id, 'marked'} (the caller drops it when an earlier page found
-- the job id running).
local stream, marks, group = KEYS[1], KEYS[2], ARGV[1]
local first = ARGV[3] == '-'
local wanted = {}
for i = 7, #ARGV do wanted[ARGV[i]] = true end
-- Everything that may fail is asked before the first write (Redis does not undo a script's
-- writes when a later call fails). The group's last delivered id: an entry after it is
-- waiting, one before it was delivered. No stream or no group yet: nothing was delivered.
-- Someone else's key at the stream's name holds no entry.
local delivered, exists = last_delivered(stream, group)
local is_stream = redis.call('TYPE', stream).ok == 'stream'
local running, size, nxt = {}, tonumber(ARGV[4]), ''
if exists then
  local page = redis.call('XPENDING', stream, group, ARGV[3], '+', size)
  for _, p in ipairs(page) do
    local entry = redis.call('XRANGE', stream, p[1], p[1])
    if #entry == 1 then
      local jid = job_id_of(p[1], entry[1][2])
      if wanted[jid] then -- every entry of the id: a producer may have sent it twice
        running[jid] = running[jid] or {}
        table.insert(running[jid], {p[1], p[2]})
      end
    end
  end
  if #page == size then nxt = '(' .. page[#page][1] end
end
local last = nxt == ''
-- On the last page, a job id that is an entry of this stream not delivered yet is waiting. A
-- job id only shaped like one may be no id Redis takes (99999999999999999999-0): its XRANGE
-- fails, and it is not waiting. Nor is one Redis reads as an entry's id but spells otherwise
-- (leading zeros: XRANGE takes 01-0 for 1-0): the entry's job id is its id as Redis spells it,
-- the one its reader looks up (the held mark, the 'job:' mark), so the text given is another
-- job id, only marked. The running entries above match the same way: by the job id of each
-- pending entry, whose id is Redis's own spelling.
local waiting = {}
for i = 7, #ARGV do
  local jid = ARGV[i]
  if last and is_stream and string.match(jid, '^%d+%-%d+$') then
    local entry = redis.pcall('XRANGE', stream, jid, jid)
    waiting[jid] = type(entry) == 'table' and not entry.err and #entry == 1
      and entry[1][1] == jid and job_id_of(jid, entry[1][2]) == jid and id_after(jid, delivered)
  end
end
if redis.call('TYPE', marks).ok ~= 'zset' then redis.call('DEL', marks) end -- someone else's
if first then
  local h = ARGV[6] ~= '' and history_at(3, ARGV[5])
  local expiry = now_ms() + tonumber(ARGV[2])
  for i = 7, #ARGV do
    if h then emit(h, 'cancel', {'job', ARGV[i], 'by', ARGV[6]}) end
    redis.call('ZADD', marks, expiry, 'job:' .. ARGV[i])
  end
end
local out, bumped, done = {}, false, {}
for i = 7, #ARGV do
  local jid = ARGV[i]
  if not done[jid] then
    done[jid] = true
    for _, found in ipairs(running[jid] or {}) do
      redis.call('ZADD', marks, HELD, 'id:' .. stream .. '|' .. found[1])
      out[#out + 1] = {jid, 'running', found[2], found[1]}
      bumped = true
    end
    if waiting[jid] then
      redis.call('ZADD', marks, HELD, 'id:' .. stream .. '|' .. jid)
      out[#out + 1] = {jid, 'waiting', jid}
    elseif last and not running[jid] then
      out[#out + 1] = {jid, 'marked'}
    end
  end
end
if bumped then -- a new value (Redis's time in µs): SET never fails, whatever was there
  local t = redis.call('TIME')
  redis.call('SET', KEYS[7], t[1] .. '.' .. string.format('%06d', tonumber(t[2])))
end
if first then sweep_held(marks, group, SWEEP) end
return {nxt, out}
