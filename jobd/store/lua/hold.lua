--! uses jobs.lua
-- hold.lua: a job that waits for others (`jobd enqueue --after`) is held in its queue, not yet in
-- its stream: unblock.lua adds it there once every job it waits for is done.
--
-- KEYS[1]   the queue's held hash: job id -> cmsgpack {due, delayed member id, name, value, …}
-- KEYS[2]   the queue's after hash: job id -> JSON {deps: [...left], all: [...], any: bool,
--           timeout_ms: how long it waits at most, or none}
-- KEYS[3..6] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- KEYS[7]   the queue's held:until set: a job that waits at most timeout_ms is in it, scored by
--           its deadline on Redis's clock (expire_held.lua)
-- ARGV[1]   the job id
-- ARGV[2]   its after JSON
-- ARGV[3]   the history's settings (lib/jobs.lua history_at)
-- ARGV[4]   its due time ('' now; Unix ms, or '+MS'), ARGV[5] its delayed member id
-- ARGV[6]   its history record (JSON, event 'waiting')
-- ARGV[7]   for a --unique job, ms its 'queued' mark outlasts its wait's bound (UNIQUE_TTL);
--           else ''
-- ARGV[8..] its fields, name, value pairs
-- KEYS[8]   a --unique job's mark (store/keys.py job_mark): checked and set here, as
--           enqueue_unique.lua does: held while its job id is queued, running or done within
--           the dedupe window, it would run twice
--
-- Returns 1 when held now, 0 when it was held already (an interrupted enqueue sent again),
-- or the mark ('queued' or 'done') of a --unique job whose job id is there already (nothing
-- written).
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
local after = cjson.decode(ARGV[2])
if KEYS[8] then
  local state = redis.call('GET', KEYS[8])
  if state then return state end
  local ttl = tonumber(ARGV[7]) + (after.timeout_ms or 0)
  redis.call('SET', KEYS[8], 'queued', 'PX', string.format('%d', ttl))
end
local held = {ARGV[4], ARGV[5]}
for i = 8, #ARGV do held[#held + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], ARGV[1], cmsgpack.pack(held))
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
local h, now = history_at(3, ARGV[3]), now_ms()
local deps = after.deps
if after.timeout_ms then
  redis.call('ZADD', KEYS[7], string.format('%d', now + after.timeout_ms), ARGV[1])
end
remember(h, {event = 'waiting', job = ARGV[1], record = ARGV[6],
  extras = {'after', table.concat(deps, ', ')}}, now, nil)
trim_history(h, now)
return 1
