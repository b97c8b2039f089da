-- dead_letter.lua: write a job's dead-letter record and acknowledge its entry, in one step.
--
-- KEYS[1]   the queue's stream
-- KEYS[2]   the queue's dead-letter stream (same cluster slot: see jobd/keys.py)
-- KEYS[3]   the queue's counters for this minute (a hash)
-- KEYS[4]   optional: the job id's mark (a --unique job's), deleted with the ack
-- ARGV[1]   the consumer group
-- ARGV[2]   this consumer's name
-- ARGV[3]   the entry's id
-- ARGV[4]   MAXLEN of the dead-letter stream (exact: dead letters are few, and a cap is a cap)
-- ARGV[5]   MINID for the dead-letter stream's max_age, or '' for none
-- ARGV[6]   seconds the counters are kept
-- ARGV[7..] the record's jobd_* fields, as name, value pairs
--
-- The record is the job's own fields (those not starting with jobd_) followed by the jobd_*
-- fields given. Returns the record's id, or {'not held', owner} when this consumer no longer
-- holds the entry (then nothing is written: the entry's new owner decides its fate).
-- A crash cannot split the two halves: the record exists if and only if the entry is acked.
local stream, dead, group, me, id = KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3]
local p = redis.call('XPENDING', stream, group, id, id, 1)
if #p == 0 or p[1][2] ~= me then
  return {'not held', (#p == 0) and '' or p[1][2]}
end
local record = {dead, 'MAXLEN', ARGV[4], '*'}
local entry = redis.call('XRANGE', stream, id, id)
if #entry == 1 then
  local fields = entry[1][2]
  for i = 1, #fields, 2 do
    if string.sub(fields[i], 1, 5) ~= 'jobd_' then
      record[#record + 1] = fields[i]
      record[#record + 1] = fields[i + 1]
    end
  end
end
for i = 7, #ARGV do record[#record + 1] = ARGV[i] end
local record_id = redis.call('XADD', unpack(record))
if ARGV[5] ~= '' then
  redis.call('XTRIM', dead, 'MINID', ARGV[5])
end
redis.call('XACK', stream, group, id)
if KEYS[4] then redis.call('DEL', KEYS[4]) end
redis.call('HINCRBY', KEYS[3], 'dead', 1)
redis.call('HINCRBY', KEYS[3], 'failed', 1)
redis.call('EXPIRE', KEYS[3], ARGV[6])
return record_id
