--! uses jobs.lua workflows.lua
-- read_levels.lua: read new entries from a queue's priority levels, highest first, in one step
-- (a queue without levels is its own one level).
--
-- KEYS[1..n] the levels' streams, highest priority first (one consumer group on each)
-- KEYS[n+1] optional: the queue's cancellation marks (cancel.lua), whether any exist is returned
-- KEYS[n+2] optional: the queue's pause (pause.lua), returned as read after the read
-- KEYS[n+3] optional, with KEYS[n+2]: the queue's cancel generation (cancel.lua), returned too
-- ARGV[1]   the consumer group
-- ARGV[2]   this consumer's name
-- ARGV[3]   how many entries at most (the free slots)
-- ARGV[4]   ignored (it was the caller's clock; kept in place so callers need not change)
-- ARGV[5]   starvation_after in ms, or 0: a lower level whose next new entry has waited that
--           long gives one entry first (aging), before the strict order. How long it waited is
--           Redis's clock (TIME) minus its id's time (set by Redis's clock too, at XADD *): the
--           same answer from every host, however far its own clock is off
-- ARGV[6]   n, how many of KEYS are levels (default: all)
-- ARGV[7]   the most bytes an entry's fields may hold to be handed over as they are (the queue's
--           max_payload and jobd.job.ENTRY_SLACK), or 0 for any: a larger entry is read (it is
--           this consumer's now) but handed over as a stand-in (lib/jobs.lua sized), so no read
--           brings the daemon more than this an entry
-- ARGV[8]   optional: k, where KEYS[k] and KEYS[k+1] are the queue's waiters hash and taken
--           hash (the last keys): each entry read of a workflow or --unique job is recorded in
--           the taken hash (lib/workflows.lua take_note), so that its end is told (and its
--           mark freed) should its entry be deleted while it is held; the waiters hash is looked at once (TYPE) a call that read
--           entries, and for each entry read only when it is a hash (jobs wait on the queue);
--           the taken hash only when a record is written
--
-- Returns {entries, newest, marks, pause, gen}: pause is the pause key's HGETALL (empty: not
-- paused), or 'wrongtype' for a key of another type, when KEYS[n+2] is given; gen is the
-- cancel generation's GET (false: none, or a key of another type); marks is 1 when
-- the cancellation marks key exists (the reader then asks which entries are cancelled:
-- cancelled.lua), after the read; entries is a list of {level index, id, fields}, taken from the
-- highest non-empty level first and then the next; when none was read, newest lists each
-- level's newest entry id ('0-0' when empty), for the reader to wait for entries after them
-- (XREAD BLOCK) without holding any. Strict priority: a level is read only when every higher
-- level had no new entry left.
local out, left = {}, tonumber(ARGV[3])
local wk = tonumber(ARGV[8] or '0')
local last = wk > 0 and wk - 1 or #KEYS -- the keys before the workflow keys
local levels = tonumber(ARGV[6]) or last
local after = tonumber(ARGV[5])
local limit = tonumber(ARGV[7]) or 0
local now = 0 -- Redis's time (ms), read only for aging (most queues have none)

-- A level that fails (NOGROUP: its stream deleted; someone else's key there) once another
-- level's entries were read (delivered: in this consumer's pending list) ends the read with
-- them, so they run now rather than after reclaim_after; with nothing read yet, the error is
-- the reply (the reader makes the group again).
local failed = nil
local function read(i, count)
  if failed then return end
  local reply = redis.pcall('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', count,
                            'STREAMS', KEYS[i], '>')
  if type(reply) == 'table' and reply.err then
    failed = reply
    return
  end
  if reply then
    for _, e in ipairs(reply[1][2]) do
      out[#out + 1] = {i, e[1], sized(e[2], limit)}
      left = left - 1
    end
  end
end

-- Whether the next entry the group has not read yet from level i waited past `after`.
local function starving(i)
  local groups = redis.pcall('XINFO', 'GROUPS', KEYS[i])
  if groups.err then return false end -- read() says why, unless something was read before it
  for _, g in ipairs(groups) do
    local fields = {}
    for j = 1, #g, 2 do fields[g[j]] = g[j + 1] end
    if fields['name'] == ARGV[1] then
      local nxt = redis.call('XRANGE', KEYS[i], '(' .. fields['last-delivered-id'], '+', 'COUNT', 1)
      return #nxt == 1 and now - tonumber(string.match(nxt[1][1], '^(%d+)')) >= after
    end
  end
  return false
end

if after > 0 and levels > 1 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  for i = 2, levels do
    if left > 0 and starving(i) then read(i, 1) end
  end
end
for i = 1, levels do
  if left <= 0 then break end
  read(i, left)
end
if failed and #out == 0 then return failed end
if wk > 0 and #out > 0 then
  local taken = taken_at(wk + 1)
  local waiters = redis.call('TYPE', KEYS[wk]).ok == 'hash' and KEYS[wk] or nil
  for _, e in ipairs(out) do take_note(taken, waiters, ARGV[1], KEYS[e[1]], e[2], e[3]) end
end
local newest = {}
if #out == 0 then
  for i = 1, levels do
    local last = redis.call('XREVRANGE', KEYS[i], '+', '-', 'COUNT', 1)
    newest[i] = (#last == 0) and '0-0' or last[1][1]
  end
end
local marks = (levels < last) and redis.call('EXISTS', KEYS[levels + 1]) or 0
local pause = false
if levels + 2 <= last then
  pause = redis.pcall('HGETALL', KEYS[levels + 2])
  if type(pause) == 'table' and pause.err then pause = 'wrongtype' end
end
local gen = false
if levels + 3 <= last then
  gen = redis.pcall('GET', KEYS[levels + 3])
  if type(gen) ~= 'string' then gen = false end
end
return {out, newest, marks, pause, gen}
