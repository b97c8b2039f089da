-- observe.lua: add counts to a queue's per-minute histograms.
--
-- KEYS[1]   the queue's histograms of this minute (a hash; jobd/store/keys.py "timings:M")
-- ARGV[1]   seconds the hash is kept
-- ARGV[2..] pairs: field ("wait:I" or "run:I", I a bucket of jobd/store/figures.py), count to add
--
-- Sent in the recorder's round trip with the outcomes it describes. Returns 1. Never fails half
-- way: someone else's key there, or a field that is no integer, leaves those counts out.
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'hash' and kind ~= 'none' then return 1 end
for i = 2, #ARGV, 2 do
  redis.pcall('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
