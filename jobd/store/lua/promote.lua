--! uses jobs.lua
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
--
-- Due means a score at or below Redis's own clock (TIME): the callers' clocks only pick when
-- to call. Returns {moved, score of the next job still waiting or false, malformed, held,
-- the error that held them back or false}. Each job
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
local delayed, stream, dead = KEYS[1], KEYS[2], KEYS[3]
local limit, queue, maxlen = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local hold = tonumber(ARGV[4])
local h = nil

local time = redis.call('TIME')
local now = time[1] .. string.format('%03d', math.floor(tonumber(time[2]) / 1000))
local due = redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, limit)
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
  if job then
    local fields = {stream, '*'}
    for i = 2, #job do fields[#fields + 1] = job[i] end
    local new = redis.call('XADD', unpack(fields))
    moved = moved + 1
    h = h or history_at(4, ARGV[5])
    local record = cjson.encode({event = 'promoted', stream = stream, new_entry = new})
    local flat = {}
    for i = 2, #job do flat[#flat + 1] = job[i] end
    remember(h, {event = 'promoted', job = job_id_of(new, flat), record = record, extras = {},
      quiet = true}, tonumber(now), new)
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
local next = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
return {moved, next[2] or false, malformed, held, held_by}
