-- release.lua: free the cluster-wide slots of entries whose outcome is recorded.
--
-- KEYS[1]   the queue's running set
-- ARGV[1..] the slots: CONSUMER|STREAM|ID (see jobd/limits.py slot_member)
--
-- Sent in the same round trip as the outcomes (see recorder.py). A slot whose release is lost
-- with a connection expires with its lease. Returns how many were held.
return redis.call('ZREM', KEYS[1], unpack(ARGV))
