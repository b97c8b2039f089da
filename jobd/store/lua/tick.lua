-- tick.lua: enqueue a periodic job for one tick, once across every daemon.
--
-- KEYS[1]   the queue's stream
-- KEYS[2]   the tick's key (jobd/store/keys.py, "tick:N:T")
-- KEYS[3]   the schedule's latest enqueued tick (jobd/store/keys.py, "schedule:N"); kept with no expiry,
--           so a restart or a reload after any outage knows where the schedule stopped. jobd's
--           own key: a value that is not a number, or a key of another type, counts as no
--           latest tick and is overwritten, so it never stops the schedule
-- ARGV[1]   milliseconds the tick's key is kept (the catch-up window and a margin for clocks that
--           disagree): a duration, counted from now
-- ARGV[2]   the tick, Unix seconds
-- ARGV[3]   -1 (a tick due while the caller ran), or a catch-up deadline in milliseconds (a tick
--           missed while it did not: jobd passes catch_up when it resumes): the tick is refused
--           when Redis's clock (TIME) is more than this past it, whatever the caller's clock says
-- ARGV[4..] the job's fields, as name, value pairs. They come from the config (payload and job
--           id), so unpacking them stays far below Lua's limit of about 8000 values.
--
-- Returns {'added', the new entry's id}; {'taken'} when the tick was already enqueued (its key
-- exists); or {'late', Redis's time in Unix ms} when the tick is past its deadline (nothing is
-- written).
local tick = tonumber(ARGV[2])
local deadline = tonumber(ARGV[3])
if deadline >= 0 then
  local time = redis.call('TIME')
  local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  if now_ms - tick * 1000 > deadline then
    return {'late', now_ms}
  end
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {'taken'}
end
-- The job first: an XADD that fails (someone else's key at the stream's name) fails before
-- anything is written, and the tick is never marked taken without its job.
local args = {KEYS[1], '*'}
for i = 4, #ARGV do args[#args + 1] = ARGV[i] end
local added = redis.call('XADD', unpack(args))
redis.call('SET', KEYS[2], '1', 'PX', ARGV[1])
-- Kept unless it is a later tick; anything else found there (not a finite number, or not a
-- string at all: WRONGTYPE) is replaced. SET overwrites a key of any type.
local found = redis.pcall('GET', KEYS[3])
local latest = type(found) == 'string' and tonumber(found) or nil
if not (latest and latest < math.huge and tick <= latest) then
  redis.call('SET', KEYS[3], ARGV[2])  -- no PX: also clears the expiry older versions set
end
return {'added', added}
