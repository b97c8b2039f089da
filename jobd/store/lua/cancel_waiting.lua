--! uses jobs.lua
-- cancel_waiting.lua: find cancelled jobs among the entries of a stream not delivered yet, one
-- page of them per call, and mark each one found until it is settled.
--
-- KEYS[1]   the stream (the queue's, or a priority level's)
-- KEYS[2]   the queue's cancellation marks (cancel.lua; a sorted set)
-- ARGV[1]   the consumer group
-- ARGV[2]   where this call's page starts: '' (just after the group's last delivered entry; the
--           stream's start when there is no group yet), or '(' and the last id of the page
--           before
-- ARGV[3]   how many entries a page holds
-- ARGV[4..] job ids, those cancel.lua found running included (a copy of one may wait behind
--           it); cancel.lua marked each 'job:JOB_ID' already, before this walk began
--
-- A job id given by its producer (the job_id field) is found only by reading the entries: the
-- walk covers the entries after the group's last delivered id, the ones no daemon has read
-- yet. One found gets the held mark 'id:STREAM|ENTRY' (lib/jobs.lua HELD): acknowledged unrun
-- whenever it is read, however long its queue stays paused, whatever becomes of the job id's
-- other entries (the 'job:' mark goes with the first one settled). An entry delivered while
-- the walk goes on was read after the 'job:' marks were made, and its reader acknowledged it
-- unrun then (cancelled.lua), unless an entry of its job id was settled in between. A marks key or a stream of another type (someone else's) finds nothing;
-- nothing below fails once a mark is written.
--
-- Returns {next, found}: next is where the following page starts, or '' after the last page;
-- found lists {job id, entry id} for each one found on this page.
local stream, marks = KEYS[1], KEYS[2]
if redis.call('TYPE', marks).ok ~= 'zset' or redis.call('TYPE', stream).ok ~= 'stream' then
  return {'', {}}
end
local start = ARGV[2]
if start == '' then
  local last, exists = last_delivered(stream, ARGV[1])
  start = exists and ('(' .. last) or '-' -- no group yet: every entry waits
end
local size = tonumber(ARGV[3])
local wanted = {}
for i = 4, #ARGV do wanted[ARGV[i]] = true end
local page = redis.call('XRANGE', stream, start, '+', 'COUNT', size)
local found = {}
for _, e in ipairs(page) do
  local jid = job_id_of(e[1], e[2])
  if wanted[jid] then
    redis.call('ZADD', marks, HELD, 'id:' .. stream .. '|' .. e[1])
    found[#found + 1] = {jid, e[1]}
  end
end
return {(#page == size) and ('(' .. page[#page][1]) or '', found}
