-- daemons_listed.lua: the daemon registry as `jobd status` and the dashboard list it
-- (jobd/store/registry.py ``listing``), in one call on the registry's node: its clock, the
-- daemons with the newest beats (the live ones), listed oldest first, and of each record only
-- the fields named, each read only when no longer than its bound. Whatever someone else wrote
-- in the registry (a field of 30 MiB, a name of any length, thousands of entries, beats at
-- +inf), a listing moves a bounded number of bytes and lists the daemons that beat last.
--
-- KEYS[1]  {jobd:daemons}  sorted set: consumer name -> last beat (Redis ms)
-- ARGV[1]  at most this many daemons listed (the newest beats not ahead of the clock)
-- ARGV[2]  the prefix of a record's key ({jobd:daemons}:daemon:): NAME's is prefix .. NAME, in
--          KEYS[1]'s slot (the hash tag)
-- ARGV[3]  bytes of a daemon's name returned at most
-- ARGV[4]  ms ahead of this clock a beat may be and still be listed (a clock stepped back); an
--          entry further ahead (+inf, a time to come) was written by no daemon: counted only
-- ARGV[5…] pairs: a field of a record, and the most bytes of it read (a longer one is not read)
--
-- Read-only: ZRANGE … BYSCORE REV LIMIT (O(log n) and the entries listed), whatever the number
-- of entries. Returns {'ok', now_ms, total, rows, ahead} or {'wrongtype', type of KEYS[1]}: the
-- entries in all, those ahead (not listed). Each row: {name (cut), its length, its score as
-- Redis writes it, the record's type ('none': gone), value, length, …}: per field named, its
-- value (false: none, or longer than its bound and not read) and its length in bytes.
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'zset' and kind ~= 'none' then return {'wrongtype', kind} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local top = string.format('%d', now + tonumber(ARGV[4]))
local newest = redis.call('ZRANGE', KEYS[1], top, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0,
  tonumber(ARGV[1]), 'WITHSCORES')
local cut = tonumber(ARGV[3])
local rows = {}
for i = #newest - 1, 1, -2 do
  local name, record = newest[i], ARGV[2] .. newest[i]
  local row = {string.sub(name, 1, cut), #name, newest[i + 1], redis.call('TYPE', record)['ok']}
  for f = 5, #ARGV, 2 do
    local value, size = false, 0
    if row[4] == 'hash' then
      size = redis.call('HSTRLEN', record, ARGV[f])
      if size <= tonumber(ARGV[f + 1]) then value = redis.call('HGET', record, ARGV[f]) end
    end
    row[#row + 1] = value
    row[#row + 1] = size
  end
  rows[#rows + 1] = row
end
local ahead = redis.call('ZCOUNT', KEYS[1], '(' .. top, '+inf')
return {'ok', now, redis.call('ZCARD', KEYS[1]), rows, ahead}
