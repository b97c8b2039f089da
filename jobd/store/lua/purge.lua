-- purge.lua: delete a dead-letter stream, saying how many records it held (`jobd dlq purge`).
--
-- KEYS[1]  the dead-letter stream
--
-- One script rather than MULTI/EXEC: the documented ACL user need not run transactions.
-- Returns how many records were deleted.
local count = redis.call('XLEN', KEYS[1])
redis.call('DEL', KEYS[1])
return count
