-- schedule.lua: add a new job to the delayed set, to be moved to the stream when due.
--
-- KEYS[1]   the queue's delayed set
-- ARGV[1]   when it is due, Unix time in milliseconds
-- ARGV[2]   a unique id for the member (the producer's token)
-- ARGV[3..] the job's fields, as name, value pairs
--
-- Same member format as retry.lua: cmsgpack.pack({unique id, name, value, …}). Returns 1.
local member = {ARGV[2]}
for i = 3, #ARGV do member[#member + 1] = ARGV[i] end
redis.call('ZADD', KEYS[1], ARGV[1], cmsgpack.pack(member))
return 1
