--! uses jobs.lua workflows.lua
-- wait_on.lua: a job (the waiter) will wait for job ARGV[1] of this queue (`jobd enqueue --after`):
-- when that one has ended already and does not run again now, how; else the waiter is
-- registered, to be told by the script that ends it (lib/workflows.lua ended). One step: no end
-- falls between the look and the registration.
--
-- It ended when its latest history record is an end (done, dead-lettered, expired, poison,
-- cancelled). A later run of it makes that end an earlier run's: a run a record tells of
-- (requeued, retried, scheduled by `jobd enqueue --delay`, promoted, reclaimed, held) is the
-- latest record already; a run that started since (enqueued again under its job id) is found
-- by its running record (``runs_now``) or, enqueued again with --unique and not read yet, by
-- its mark saying 'queued'. Then the waiter waits for the end of that run.
--
-- KEYS[1]   the queue's history hash
-- KEYS[2]   the queue's waiters hash
-- KEYS[3]   the queue's active hash (start.lua)
-- KEYS[4]   the job id's --unique mark (jobd/store/keys.py job_mark)
-- KEYS[5]   the queue's taken hash (lib/workflows.lua take_note): a job that runs now, its
--           entry found by its running record, is recorded there once a waiter is registered
--           (a job read before it had waiters has no record: its end, should its entry be
--           deleted, could not be told); one that runs but has no running record yet (its
--           first half second) cannot be found, nor recorded; the record goes with the job's
--           end (settle.lua, dead_letter.lua: lib/workflows.lua untake), and each write sweeps
--           as the read's does (``sweep_taken``)
-- KEYS[6..] the queue's streams (its own, and each priority level's)
-- ARGV[1]   the job id waited for
-- ARGV[2]   the waiter, one JSON line (store/workflows.py waiter_line)
-- ARGV[3]   the queue's consumer group
-- ARGV[4], ARGV[5] the waiter's job id and its hold's token (in the line): the waiter is
--           registered once however often sent, in fields of its own (lib/workflows.lua
--           add_waiter), at a cost that does not grow with the number registered before
--
-- Keys of another type than jobd's (someone else's) are read as holding nothing; the only write,
-- the registration, comes last. Returns {outcome, event} when the job ended (outcome: done,
-- failed, cancelled), else {'waiting'}.
local job = ARGV[1]

-- The last line of ``s`` (a '\n' at its end left out), looked for from the end, in windows
-- growing fourfold: the cost is that of the last record, whatever comes before it. (A pattern
-- anchored at the end only, '[^\n]*$', is tried from every byte of ``s``, each try running to
-- the end of its line: quadratic in a record's length, seconds of Redis for one long record.)
local function last_line(s)
  local stop = #s
  if string.byte(s, stop) == 10 then stop = stop - 1 end
  local size = 256
  while true do
    local from = math.max(1, stop - size + 1)
    local tail = string.sub(s, from, stop)
    local back = string.find(string.reverse(tail), '\n', 1, true)
    if back then return string.sub(tail, #tail - back + 2) end
    if from == 1 then return tail end
    size = size * 4
  end
end

-- How the job's latest record says it ended (its outcome and event), or nil.
local function ended_as()
  local records = redis.pcall('HGET', KEYS[1], job)
  if type(records) ~= 'string' or records == '' then return nil end
  local ok, last = pcall(cjson.decode, last_line(records))
  if ok and type(last) == 'table' and type(last.event) == 'string' and ENDS[last.event] then
    return ENDS[last.event], last.event
  end
  return nil
end

-- Whether a run of the job is under way now: its running record ("STREAM|ENTRY\n{…}", written
-- once its handler has run half a second) names an entry of one of the queue's streams still
-- pending in its group. A record a daemon killed -9 left behind, its entry settled since (by the
-- daemon that took it over), is not believed; nor is one naming a key not among the queue's.
-- Its stream and entry when it runs, else false.
local function runs_now()
  local v = redis.pcall('HGET', KEYS[3], job)
  if type(v) ~= 'string' then return false end
  local cut = string.find(v, '\n', 1, true)
  if not cut or cut > 4096 then return false end
  local stream, entry = string.match(string.sub(v, 1, cut - 1), '^(.*)|(%d+%-%d+)$')
  if not stream then return false end
  for k = 6, #KEYS do
    if KEYS[k] == stream then
      if redis.call('TYPE', stream).ok ~= 'stream' then return false end
      local p = redis.pcall('XPENDING', stream, ARGV[3], entry, entry, 1)
      return type(p) == 'table' and not p.err and #p == 1 and stream, entry
    end
  end
  return false
end

local outcome, event = ended_as()
local stream, entry = runs_now()
if outcome and not (stream or says_queued(KEYS[4])) then
  return {outcome, event}
end
upgrade_waiters(KEYS[2], job)
add_waiter(KEYS[2], job, ARGV[4], ARGV[5], ARGV[2])
local taken = stream and taken_key(taken_at(5))
if taken then -- kept when there (a batch's: the read wrote it, with the batch)
  redis.call('HSETNX', taken, stream .. '|' .. entry, cmsgpack.pack({job, '', ''}))
  sweep_taken(taken, ARGV[3]) -- as every write of a record does (lib/workflows.lua take_note)
end
return {'waiting'}
