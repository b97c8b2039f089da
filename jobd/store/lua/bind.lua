-- bind.lua: after a read, turn the slots acquire.lua took into the entries read, and give back
-- what was not used (slots and rate tokens).
--
-- KEYS[1]   the queue's running set
-- KEYS[2]   the queue's token bucket
-- KEYS[3]   the queue's stream
-- ARGV[1]   this consumer's name
-- ARGV[2]   how many slots and tokens acquire.lua granted
-- ARGV[3]   the slots' lease, ms: they expire that long after now by Redis's clock (TIME), one
--           clock for every host
-- ARGV[4]   whether the queue has a slot limit (1) or not (0)
-- ARGV[5]   whether the queue has a rate limit (1) or not (0), and then
-- ARGV[6]   the bucket's capacity
-- ARGV[7..] the slots of the entries read: CONSUMER|STREAM|ID (jobd/store/keys.py slot_member)
--
-- Returns the id of the stream's newest entry ('0-0' when empty): a reader that read nothing
-- waits for entries after it (XREAD BLOCK) holding no slot.
local running, bucket, me = KEYS[1], KEYS[2], ARGV[1]
local granted, used = tonumber(ARGV[2]), #ARGV - 6
if ARGV[4] == '1' then
  local t = redis.call('TIME')
  local expiry = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[3])
  for i = 1, granted do redis.call('ZREM', running, 'wait:' .. me .. ':' .. i) end
  for i = 7, #ARGV do redis.call('ZADD', running, expiry, ARGV[i]) end
end
if ARGV[5] == '1' and used < granted and redis.call('TYPE', bucket).ok == 'hash' then
  local tokens = tonumber(redis.call('HGET', bucket, 'tokens') or '0') or 0
  tokens = math.min(tonumber(ARGV[6]), tokens + granted - used)
  redis.call('HSET', bucket, 'tokens', tostring(tokens))
end
local newest = redis.pcall('XREVRANGE', KEYS[3], '+', '-', 'COUNT', 1) -- after the writes
if newest.err or #newest == 0 then return '0-0' end
return newest[1][1]
