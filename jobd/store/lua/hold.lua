--! uses jobs.lua workflows.lua
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
-- ARGV[7]   for a --unique job, ms its 'queued' mark outlasts its wait's bound and its delay
--           (UNIQUE_TTL; with no bound it has no expiry while held: unblock.lua's release sets
--           the one enqueue_unique.lua would); else ''
-- ARGV[8..] its fields, name, value pairs
-- KEYS[8]   the queue's held:ended set (lib/workflows.lua hold_ended): the job ids whose hold
--           ended (released, dead-lettered), each until its deadline on Redis's clock
-- KEYS[9]   a --unique job's mark (store/keys.py job_mark): checked and set here, as
--           enqueue_unique.lua does: held while its job id is queued, running or done within
--           the dedupe window, it would run twice
--
-- An enqueue sent again (its reply lost, or the command run again: docs/workflows.md) holds
-- once: while the job is held (0), and once its hold ended, released or dead-lettered, for
-- the queue's history.max_age after (-1): without this, a job released (by the enqueue itself,
-- a job it waits for having ended already, or by a daemon) was held again, and ran again.
--
-- The job's own expiry (its field jobd_expires_at: Unix ms on Redis's clock, jobd.newjob) bounds
-- its hold too: a job not started by then is not run, held or not. Its deadline in held:until
-- is the earlier of the two; past it, expire_held.lua dead-letters it `expired`.
--
-- A bound (timeout_ms) is cut to MAX_WAIT_MS (workflows.MAX_AFTER_TIMEOUT: ten years, the
-- producer refuses more): one past 2^63 ms with Redis's clock added was scored -2^63 in
-- held:until, due at once (dead-lettered `dependency` at the next pass, not waiting for ever).
--
-- Returns 1 when held now, {0, its hold's delayed member id} when it is held already (that
-- hold's token: the waiter lines name it, store/workflows.py waiter_line), -1 when its hold
-- ended within the window (nothing written), or the mark ('queued' or 'done') of a --unique
-- job whose job id is there already (nothing written).
local packed = redis.call('HGET', KEYS[1], ARGV[1])
if packed then return {0, cmsgpack.unpack(packed)[2]} end
local MAX_WAIT_MS = 315360000000 -- jobd.workflows.MAX_AFTER_TIMEOUT * 1000
local after, now = cjson.decode(ARGV[2]), now_ms()
local bound = tonumber(after.timeout_ms)
if bound then bound = math.min(math.max(bound, 0), MAX_WAIT_MS) end
if KEYS[9] then
  local state = redis.call('GET', KEYS[9])
  if state then return state end
end
if hold_ended_at(KEYS[8], ARGV[1], now) then return -1 end
if KEYS[9] and bound then -- held at most its bound, then delayed: the mark outlasts both
  local ttl = tonumber(ARGV[7]) + bound + delay_of(ARGV[4])
  redis.call('SET', KEYS[9], 'queued', 'PX', string.format('%d', ttl))
elseif KEYS[9] then -- held with no bound: the mark lives while it is held (released: remark)
  redis.call('SET', KEYS[9], 'queued')
end
local held = {ARGV[4], ARGV[5]}
for i = 8, #ARGV do held[#held + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], ARGV[1], cmsgpack.pack(held))
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
local h = history_at(3, ARGV[3])
local deps = after.deps
local deadline = bound and now + bound
for i = 8, #ARGV - 1, 2 do
  local expires = ARGV[i] == 'jobd_expires_at' and tonumber(ARGV[i + 1])
  if expires and not (deadline and deadline <= expires) then deadline = expires end
end
if deadline then
  redis.call('ZADD', KEYS[7], string.format('%d', deadline), ARGV[1])
end
local fields = {}
for i = 8, #ARGV do fields[#fields + 1] = ARGV[i] end
remember(h, linked({event = 'waiting', job = ARGV[1], record = ARGV[6],
  extras = {'after', table.concat(deps, ', ')}}, batch_in(fields)), now, nil)
trim_history(h, now)
return 1
