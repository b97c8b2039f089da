-- acquire.lua: take up to N of a queue's cluster-wide slots and rate tokens before a read.
--
-- KEYS[1]   the queue's running set (sorted set: member -> lease expiry, Unix ms)
-- KEYS[2]   the queue's token bucket (hash: tokens, at)
-- KEYS[3]   the queue's waiting consumers (hash: consumer -> reason)
-- ARGV[1]   now, Unix ms (the caller's clock; every daemon's clocks are assumed close)
-- ARGV[2]   how many this consumer could start (its free local slots)
-- ARGV[3]   this consumer's name
-- ARGV[4]   the slot limit, or 0 for none
-- ARGV[5]   expiry of the slots taken now, Unix ms (they are bound to entries or freed by
--           bind.lua right after the read; expiry covers a consumer that dies in between)
-- ARGV[6]   tokens added per ms, or 0 for no rate limit
-- ARGV[7]   the bucket's capacity (burst)
--
-- Expired slots (their holder died) are dropped first. Returns {granted, wait ms}: granted is
-- at most what both limits allow now; when it is 0, wait is how long until a token is due
-- (rate) or a hint to poll again (slots), and this consumer is listed as waiting, with why.
local running, bucket, waiting = KEYS[1], KEYS[2], KEYS[3]
local now, want, me = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local limit, rate, burst = tonumber(ARGV[4]), tonumber(ARGV[6]), tonumber(ARGV[7])
local grant, reason, wait = want, '', 0
if limit > 0 then
  redis.call('ZREMRANGEBYSCORE', running, '-inf', now)
  local free = limit - redis.call('ZCARD', running)
  if free < grant then grant = math.max(free, 0); reason = 'slot' end
end
if rate > 0 then
  local state = redis.call('HMGET', bucket, 'tokens', 'at')
  local tokens = tonumber(state[1] or burst)
  local at = tonumber(state[2] or now)
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
    redis.call('ZADD', running, ARGV[5], 'wait:' .. me .. ':' .. i)
  end
end
if grant == 0 and want > 0 then
  redis.call('HSET', waiting, me, reason .. ' ' .. now)
else
  redis.call('HDEL', waiting, me)
end
return {grant, wait}
