--! uses jobs.lua
-- batch.lua: a batch of jobs (`jobd enqueue --batch ID`), its counts in one hash, in a slot of its
-- own (jobd/store/keys.py batch): who adds to it opens it and seals it when done adding; each
-- member's end is counted once (its notice may be moved twice: the members set says); the batch
-- is complete once sealed with every member counted, and says so to whoever asks after that
-- (the callback's own mark makes it once: callback.lua).
--
-- KEYS[1]   the batch's hash: state (open, sealed, complete), open (adders at work), total,
--           done, failed, ttl, created, completed (Redis ms), on_complete, callback (JSON)
-- KEYS[2]   the batch's members counted: a set of "QUEUE JOB_ID"
-- ARGV[1]   the operation:
--   open TTL ON_COMPLETE CALLBACK   one more adder; refused (an error) once complete
--   add N                           N more members (N < 0: fewer, those Redis refused)
--   seal                            one adder less; sealed when none is left
--   count MEMBER OUTCOME            a member's end (outcome done, failed or cancelled)
--   show                            nothing changes
-- Both keys expire TTL seconds (the history's max_age) after the batch's latest change.
--
-- Returns {state, total, done, failed, on_complete, callback}; {} when there is no such batch
-- (expired, or never made) for count and show.
local b, members, op = KEYS[1], KEYS[2], ARGV[1]
local function status()
  local v = redis.call('HMGET', b, 'state', 'open', 'total', 'done', 'failed', 'on_complete',
    'callback')
  local state, total, settled = v[1], tonumber(v[3]), tonumber(v[4]) + tonumber(v[5])
  if state ~= 'complete' and tonumber(v[2]) <= 0 and settled >= total then
    state = 'complete'
    redis.call('HSET', b, 'state', state, 'completed', string.format('%d', now_ms()))
  end
  return {state, v[3], v[4], v[5], v[6] or '', v[7] or ''}
end
local function keep()
  local ttl = redis.call('HGET', b, 'ttl')
  redis.call('EXPIRE', b, ttl)
  if redis.call('EXISTS', members) == 1 then redis.call('EXPIRE', members, ttl) end
end
if op == 'open' then
  if redis.call('HGET', b, 'state') == 'complete' then
    return redis.error_reply('ERR batch complete: it takes no more jobs')
  end
  if redis.call('EXISTS', b) == 0 then
    redis.call('HSET', b, 'total', 0, 'done', 0, 'failed', 0, 'open', 0,
      'created', string.format('%d', now_ms()))
  end
  redis.call('HINCRBY', b, 'open', 1)
  redis.call('HSET', b, 'state', 'open', 'ttl', ARGV[2])
  if ARGV[3] ~= '' then
    redis.call('HSETNX', b, 'on_complete', ARGV[3])
    redis.call('HSETNX', b, 'callback', ARGV[4])
  end
  keep()
  return status()
end
if redis.call('EXISTS', b) == 0 then return {} end
if op == 'add' then
  redis.call('HINCRBY', b, 'total', ARGV[2])
elseif op == 'seal' then
  if redis.call('HINCRBY', b, 'open', -1) <= 0 and redis.call('HGET', b, 'state') == 'open' then
    redis.call('HSET', b, 'open', 0, 'state', 'sealed')
  end
elseif op == 'count' then
  if redis.call('SADD', members, ARGV[2]) == 1 then
    redis.call('HINCRBY', b, ARGV[3] == 'done' and 'done' or 'failed', 1)
  end
elseif op ~= 'show' then
  return redis.error_reply('ERR batch.lua: unknown operation ' .. op)
end
if op ~= 'show' then keep() end
return status()
