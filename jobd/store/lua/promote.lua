--! uses jobs.lua workflows.lua
-- promote.lua: move due jobs from the delayed set to the stream.
--
-- KEYS[1]  the queue's delayed set
-- KEYS[2]  the queue's stream
-- KEYS[3]  the queue's dead-letter stream (same cluster slot: see jobd/store/keys.py)
-- KEYS[4..7] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- ARGV[1]  move at most this many
-- ARGV[2]  the queue's name (jobd_queue of a malformed member's record)
-- ARGV[3]  MAXLEN of the dead-letter stream (exact, as dead_letter.lua)
-- ARGV[4]  milliseconds a malformed member is held back when its record cannot be written
-- ARGV[5]  the history's settings (lib/jobs.lua history_at)
-- KEYS[8]  optional: the queue's cancellation marks (cancel.lua), then KEYS[9] its counters for
--          this minute (a hash), ARGV[6] seconds they are kept and ARGV[7] the key of job id
--          J's mark less J (jobd/store/keys.py job_mark(''): a --unique job's, same slot);
--          KEYS[10], KEYS[11] the queue's waiters hash and outbox (lib/workflows.lua ended)
--
-- Due means a score at or below Redis's own clock (TIME): the callers' clocks only pick when
-- to call. Returns {moved, score of the next job still waiting or false, malformed, held,
-- the error that held them back or false, cancelled}. Each job
-- is added to the stream and removed from the set in this one script, so any number of
-- daemons may run it at once: a job is moved exactly once, and a crash between the two halves
-- cannot happen. A member that is not a job (see decode: others write members too) is moved
-- aside, never run: a record on the dead-letter stream (jobd_error 'malformed', jobd_queue,
-- jobd_reason, jobd_member: its bytes, jobd_failed_at: Unix ms) replaces it in the same script,
-- and the jobs behind it are moved as usual. When that record cannot be written (the
-- dead-letter key holds another type, say), the member stays in the set, held back: its score
-- becomes Redis's time plus ARGV[4], so it no longer stops the jobs behind it, this call or the
-- next ones, and is tried again later (it stays visible to delayed_list.lua meanwhile): "held"
-- counts them. A malformed member has no due time worth keeping. A job moved is in its history
-- ('promoted', new_entry: where `jobd job` finds it next) in the same step.
--
-- A due job whose job id `jobd cancel` marked ('job:JOB_ID', not expired) is not moved: it is
-- removed, its mark with it, a --unique job's mark deleted if it still says 'queued', and
-- recorded cancelled, in the same step. So a job the cancel's walk missed as it moved from the
-- delayed set to the stream (the walk asks the streams first) never runs: the cancel marks
-- every job id it is asked for before it walks anything. Returned as the 6th element. Its
-- batch and the jobs waiting for it are told (lib/workflows.lua ended).
local delayed, stream, dead = KEYS[1], KEYS[2], KEYS[3]
local limit, queue, maxlen = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local hold = tonumber(ARGV[4])
local h = nil
local marks = KEYS[8] and redis.call('TYPE', KEYS[8]).ok == 'zset' and KEYS[8] or nil
local cancelled, w = 0, nil

local time = redis.call('TIME')
local now = time[1] .. string.format('%03d', math.floor(tonumber(time[2]) / 1000))
local due = redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, limit)
-- Someone else's key at the stream's name: refused before any member moves (an XADD failing
-- after a malformed member's dead letter was written would end the call half-way).
local kind = redis.call('TYPE', stream).ok
if #due > 0 and kind ~= 'stream' and kind ~= 'none' then
  return redis.error_reply('WRONGTYPE promote.lua: ' .. stream .. ' is a ' .. kind)
end
-- Dead-letter a malformed member: true, or false and Redis's error when it cannot be written.
local function dead_letter(member, why)
  local reply = redis.pcall('XADD', dead, 'MAXLEN', maxlen, '*', 'jobd_error', 'malformed',
    'jobd_queue', queue, 'jobd_reason', why, 'jobd_member', member, 'jobd_failed_at', now)
  if type(reply) == 'table' and reply.err then return false, reply.err end
  return true
end

local moved, malformed, held, held_by = 0, 0, 0, false
for _, member in ipairs(due) do
  local job, why = decode_member(member)
  local flat, cancel_mark = {}, nil
  if job then
    for i = 2, #job do flat[#flat + 1] = job[i] end
    local id = job_id_of('', flat)
    local until_ms = marks and id ~= '' and redis.call('ZSCORE', marks, 'job:' .. id)
    if until_ms and tonumber(until_ms) > tonumber(now) then cancel_mark = id end
  end
  if cancel_mark then
    redis.call('ZREM', delayed, member)
    redis.call('ZREM', marks, 'job:' .. cancel_mark)
    local unique = false
    for i = 1, #flat, 2 do unique = unique or flat[i] == 'jobd_unique' end
    if unique and ARGV[7] and says_queued(ARGV[7] .. cancel_mark) then
      redis.call('DEL', ARGV[7] .. cancel_mark)
    end
    h = h or history_at(4, ARGV[5])
    local origin = origin_of(flat)
    local record = cjson.encode({event = 'cancelled', stream = stream, origin = origin,
      detail = 'cancelled (jobd cancel) as it became due: not moved to the stream'})
    local batch, incarnation = batch_in(flat)
    remember(h, linked({event = 'cancelled', job = cancel_mark, record = record,
      extras = with_origin({}, origin)}, batch, incarnation), tonumber(now), nil)
    w = w or workflow_at(10, h.queue)
    ended(w, cancel_mark, 'cancelled', batch, incarnation)
    cancelled = cancelled + 1
  elseif job then
    local fields = {stream, '*'}
    for i = 2, #job do fields[#fields + 1] = job[i] end
    local new = redis.call('XADD', unpack(fields))
    moved = moved + 1
    h = h or history_at(4, ARGV[5])
    local record = cjson.encode({event = 'promoted', stream = stream, new_entry = new})
    remember(h, linked({event = 'promoted', job = job_id_of(new, flat), record = record,
      extras = {}, quiet = true}, batch_in(flat)), tonumber(now), new)
    redis.call('ZREM', delayed, member)
  else
    local written, err = dead_letter(member, why)
    if written then
      malformed = malformed + 1
      redis.call('ZREM', delayed, member)
    else
      held, held_by = held + 1, err
      redis.call('ZADD', delayed, 'XX', string.format('%d', tonumber(now) + hold), member)
    end
  end
end
if h then trim_history(h, tonumber(now)) end
if cancelled > 0 then add_count(KEYS[9], 'cancelled', cancelled, ARGV[6]) end
local next = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
return {moved, next[2] or false, malformed, held, held_by, cancelled}
