-- release.lua: free the cluster-wide slots of entries whose outcome is recorded.
--
-- KEYS[1]   the queue's running set
-- ARGV[1..] the slots: CONSUMER|STREAM|ID (see jobd/store/keys.py slot_member); any number
--
-- Sent in the same round trip as the outcomes (see recorder.py). A slot whose release is lost
-- with a connection expires with its lease. Returns how many were held.
--
-- ZREM takes the slots in chunks: Lua's unpack fails above ~8000 values ("too many results to
-- unpack"), and a batch of outcomes can free more slots than that.
local CHUNK = 1000
local removed = 0
for first = 1, #ARGV, CHUNK do
  local members = {}
  for i = first, math.min(first + CHUNK - 1, #ARGV) do members[#members + 1] = ARGV[i] end
  removed = removed + redis.call('ZREM', KEYS[1], unpack(members))
end
return removed
