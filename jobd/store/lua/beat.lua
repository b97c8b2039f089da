-- beat.lua: a daemon's heartbeat in the daemon registry (jobd/store/registry.py), and the sweep of
-- entries whose daemons stopped beating long ago.
--
-- KEYS[1]  {jobd:daemons}        sorted set: consumer name -> last beat (Redis ms)
-- KEYS[2]  {jobd:daemons}:sweep  sorted set: consumer name -> when its entry goes (Redis ms)
-- KEYS[3]  {jobd:daemons}:daemon:NAME  this daemon's record, a hash
-- ARGV[1]  the consumer name
-- ARGV[2]  how long the entry and record are kept without a beat (ms)
-- ARGV[3]  at most this many entries of other daemons swept in this call
-- ARGV[4]  this process's instance: drawn at its start, its own whatever its name ('': none)
-- ARGV[5…] field, value, … of the record to write (``beat`` and ``started`` are written here,
--          from Redis's clock)
--
-- Two processes that drew the same name (host, pid and random bits alike: containers) would
-- write one record in turn and be listed as one: a beat that finds the record written by
-- another instance marks it (``clash``, Redis ms), and the listing says so while the mark is
-- recent.
--
-- Returns {'ok', now_ms, created (1: the record was new, or had expired), swept}, or
-- {'wrongtype', key, type} and writes nothing when a key holds something else (someone else's
-- key: it is never overwritten). A swept entry's record expires by itself (PEXPIRE, same bound).
local registry, sweep, record = KEYS[1], KEYS[2], KEYS[3]
local expected = {[registry] = 'zset', [sweep] = 'zset', [record] = 'hash'}
for _, key in ipairs(KEYS) do
  local t = redis.call('TYPE', key)['ok']
  if t ~= 'none' and t ~= expected[key] then return {'wrongtype', key, t} end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local keep = tonumber(ARGV[2])
local instance = ARGV[4]
if instance ~= '' then
  local was = redis.call('HGET', record, 'instance')
  if was and was ~= instance then redis.call('HSET', record, 'clash', now) end
  redis.call('HSET', record, 'instance', instance)
end
local created = redis.call('HSETNX', record, 'started', now)
local i = 5
while i <= #ARGV do  -- pairs one at a time: no unpack of a long list
  redis.call('HSET', record, ARGV[i], ARGV[i + 1])
  i = i + 2
end
redis.call('HSET', record, 'beat', now)
redis.call('PEXPIRE', record, keep)
redis.call('ZADD', registry, now, ARGV[1])
redis.call('ZADD', sweep, now + keep, ARGV[1])
local gone = redis.call('ZRANGEBYSCORE', sweep, '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
for _, name in ipairs(gone) do
  redis.call('ZREM', registry, name)
  redis.call('ZREM', sweep, name)
end
return {'ok', now, created, #gone}
