--! uses jobs.lua
-- schedule.lua: add a new job to the delayed set, to be moved to the stream when due.
--
-- KEYS[1]   the queue's delayed set
-- KEYS[2]   optional: the queue's stream. With it, a job already due by Redis's clock (TIME:
--           ARGV[1] at or before now, or '+0') is added to the stream at once instead.
-- ARGV[1]   when it is due: Unix time in milliseconds (an absolute time: '1796115600000'), or
--           '+' and milliseconds from now on Redis's clock ('+600000': ten minutes after
--           Redis's TIME), so that the caller's clock plays no part in a delay
-- ARGV[2]   a unique id for the member (the producer's token)
-- ARGV[3..] the job's fields, as name, value pairs: 1 to MAX_FIELDS pairs
--
-- Same member format as retry.lua: cmsgpack.pack({unique id, name, value, …}), scored by the
-- due time in Unix ms. Returns 1 when the job went into the delayed set, or (only with KEYS[2])
-- the new entry's id when it was due and went to the stream. Returns an error, and adds
-- nothing, for no fields, an odd number of field arguments, too many, or a due time that is
-- neither form.
local bad = check_fields('schedule.lua', 3, ' after the due time and the unique id')
if bad then return bad end

local now, due, score = due_time(ARGV[1])
if not due then return bad_due('schedule.lua', ARGV[1]) end

if KEYS[2] and due <= now then
  local args = {KEYS[2], '*'}
  for i = 3, #ARGV do args[#args + 1] = ARGV[i] end
  return redis.call('XADD', unpack(args))
end
local member = {ARGV[2]}
for i = 3, #ARGV do member[#member + 1] = ARGV[i] end
redis.call('ZADD', KEYS[1], score, cmsgpack.pack(member))
return 1
