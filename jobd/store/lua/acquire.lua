-- acquire.lua: take up to N of a queue's cluster-wide slots and rate tokens before a read.
--
-- KEYS[1]   the queue's running set (sorted set: member -> lease expiry, Unix ms by Redis TIME)
-- KEYS[2]   the queue's token bucket (hash: tokens, at = Unix ms by Redis TIME)
-- KEYS[3]   the queue's waiting consumers (hash: consumer -> "reason now", Unix ms by Redis TIME)
-- ARGV[1]   how many this consumer could start (its free local slots)
-- ARGV[2]   this consumer's name
-- ARGV[3]   the slot limit, or 0 for none
-- ARGV[4]   lease of the slots taken now, ms (they are bound to entries or freed by bind.lua
--           right after the read; the lease covers a consumer that dies in between)
-- ARGV[5]   tokens added per ms, or 0 for no rate limit
-- ARGV[6]   the bucket's capacity (burst)
-- ARGV[7]   ms after which a waiting consumer's field is stale: a waiting reader asks again
--           far more often, so an older field is a stopped or dead one's; it is removed
--
-- Every time decision uses Redis's clock (TIME), one clock for every host: callers pass
-- durations only. Expired slots (their holder died) are dropped first, and so are stale
-- waiting fields. Returns {granted, wait ms}: granted is at most what both limits allow now;
-- when it is 0, wait is how long until a token is due (rate) or 0 (slots: poll again), and
-- this consumer is listed as waiting, with why.
local running, bucket, waiting = KEYS[1], KEYS[2], KEYS[3]
local want, me, limit = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local lease_ms, rate, burst = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local stale_ms = tonumber(ARGV[7])
-- jobd's own keys: one of another type there (someone else's) is replaced, before any write, so
-- no call below fails half-way (slots and tokens taken, the caller told nothing).
for key, kind in pairs({[running] = 'zset', [bucket] = 'hash', [waiting] = 'hash'}) do
  local t = redis.call('TYPE', key).ok
  if t ~= kind and t ~= 'none' then redis.call('DEL', key) end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local grant, reason, wait = want, '', 0

-- Fields of consumers that stopped asking (their time older than stale_ms, or unreadable).
local function prune_waiting()
  local flat = redis.call('HGETALL', waiting)
  for i = 1, #flat, 2 do
    local at = tonumber(string.match(flat[i + 1], ' (%d+)$') or '')
    if at == nil or now - at > stale_ms then redis.call('HDEL', waiting, flat[i]) end
  end
end

if limit > 0 then
  redis.call('ZREMRANGEBYSCORE', running, '-inf', now)
  local free = limit - redis.call('ZCARD', running)
  if free < grant then grant = math.max(free, 0); reason = 'slot' end
end
if rate > 0 then
  local state = redis.call('HMGET', bucket, 'tokens', 'at')
  local tokens = tonumber(state[1] or burst) or burst -- a value that is no number: a full bucket
  local at = tonumber(state[2] or now) or now
  tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
  if math.floor(tokens) < grant then
    grant = math.floor(tokens)
    reason = 'rate'
    wait = math.ceil((1 - (tokens - grant)) / rate)
  end
  tokens = tokens - grant
  redis.call('HSET', bucket, 'tokens', tostring(tokens), 'at', now)
  redis.call('PEXPIRE', bucket, math.ceil(burst / rate) + 60000)
end
if grant > 0 and limit > 0 then
  for i = 1, grant do
    redis.call('ZADD', running, now + lease_ms, 'wait:' .. me .. ':' .. i)
  end
end
prune_waiting()
if grant == 0 and want > 0 then
  redis.call('HSET', waiting, me, reason .. ' ' .. now)
  redis.call('PEXPIRE', waiting, stale_ms)
else
  redis.call('HDEL', waiting, me)
end
return {grant, wait}
