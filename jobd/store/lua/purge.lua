--! uses jobs.lua
-- purge.lua: delete a dead-letter stream, saying how many records it held (`jobd dlq purge`).
--
-- KEYS[1]  the dead-letter stream
-- KEYS[2..5] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- ARGV[1]  the history's settings (lib/jobs.lua history_at)
-- ARGV[2]  who purges (user@host)
--
-- One script rather than MULTI/EXEC: the documented ACL user need not run transactions. The
-- purge is in the queue's events (purge, by, count) in the same step. Returns how many records
-- were deleted.
local count = redis.call('XLEN', KEYS[1])
redis.call('DEL', KEYS[1])
emit(history_at(2, ARGV[1]), 'purge', {'by', ARGV[2], 'count', tostring(count)})
return count
