-- schedule.lua: add a new job to the delayed set, to be moved to the stream when due.
--
-- KEYS[1]   the queue's delayed set
-- ARGV[1]   when it is due, Unix time in milliseconds
-- ARGV[2]   a unique id for the member (the producer's token)
-- ARGV[3..] the job's fields, as name, value pairs: 1 to MAX_FIELDS pairs
--
-- Same member format as retry.lua: cmsgpack.pack({unique id, name, value, …}). Returns 1, or
-- an error (and adds nothing) for no fields, an odd number of field arguments, or too many.
local MAX_FIELDS = 1000 -- jobd.job.MAX_FIELDS
local count = #ARGV - 2
if count < 2 or count % 2 == 1 then
  return redis.error_reply(string.format(
    'ERR schedule.lua: the job fields must be name, value pairs, at least one: got %d ' ..
    'argument(s) after the due time and the unique id', math.max(count, 0)))
end
if count / 2 > MAX_FIELDS then
  return redis.error_reply(string.format(
    'ERR schedule.lua: %d fields, more than %d (jobd.job.MAX_FIELDS)', count / 2, MAX_FIELDS))
end
local member = {ARGV[2]}
for i = 3, #ARGV do member[#member + 1] = ARGV[i] end
redis.call('ZADD', KEYS[1], ARGV[1], cmsgpack.pack(member))
return 1
