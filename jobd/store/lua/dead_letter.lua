--! uses jobs.lua
-- dead_letter.lua: write a job's dead-letter record and acknowledge its entry, in one step.
--
-- KEYS[1]   the queue's stream
-- KEYS[2]   the queue's dead-letter stream (same cluster slot: see jobd/store/keys.py)
-- KEYS[3]   the queue's counters for this minute (a hash)
-- KEYS[4..7] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- KEYS[8]   optional: the job id's mark (a --unique job's), deleted with the ack if 'queued'
-- ARGV[1]   the consumer group
-- ARGV[2]   this consumer's name
-- ARGV[3]   the entry's id
-- ARGV[4]   MAXLEN of the dead-letter stream (exact: dead letters are few, and a cap is a cap)
-- ARGV[5]   dead_letter.max_age in ms, or '' for none: older records are trimmed
-- ARGV[6]   seconds the counters are kept
-- ARGV[7]   the history's settings (lib/jobs.lua history_at)
-- ARGV[8..] the attempt's note (lib/jobs.lua note_at: event dead-lettered, expired or poison),
--           then the record's jobd_* fields, as name, value pairs
--
-- The record is the job's own fields (those not starting with jobd_, plus jobd_unique, so that a
-- requeue keeps the job unique, and the producer's limits jobd_timeout, jobd_max_attempts and
-- jobd_expires_at: jobd.job.LIMIT_FIELDS) followed by the jobd_* fields given and
-- jobd_failed_at. An entry with more than MAX_FIELDS own fields cannot be copied (a
-- script passes at most ~8000 values to a command): its record keeps only its payload and
-- job_id, and jobd_fields says how many it had. Returns the record's id, or {'not held',
-- owner} when this consumer no longer holds the entry (then nothing is written: the entry's
-- new owner decides its fate). A crash cannot split the two halves: the record exists if and
-- only if the entry is acked, and so are the job's history record and event. Times are Redis's own (TIME): the record's jobd_failed_at and
-- the max_age cutoff agree whatever the clock of the daemon that sends this.
local stream, dead, group, me, id = KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3]
local KEPT = {jobd_unique = true, jobd_timeout = true, jobd_max_attempts = true,
  jobd_expires_at = true}
local p = redis.call('XPENDING', stream, group, id, id, 1)
if #p == 0 or p[1][2] ~= me then
  return {'not held', (#p == 0) and '' or p[1][2]}
end
local now = now_ms()
local h = history_at(4, ARGV[7])
local note, first = note_at(8)
local record = {dead, 'MAXLEN', ARGV[4], '*'}
local entry = redis.call('XRANGE', stream, id, id)
if #entry == 1 then
  local fields, own = entry[1][2], {}
  for i = 1, #fields, 2 do
    local name = fields[i]
    if string.sub(name, 1, 5) ~= 'jobd_' or KEPT[name] then own[#own + 1] = i end
  end
  -- Counted as pairs, duplicate names included (an entry may repeat a name): too wide, only
  -- the first payload and the first job_id are kept.
  local wide, kept = #own > MAX_FIELDS, {}
  for _, i in ipairs(own) do
    local name = fields[i]
    if not wide or ((name == 'payload' or name == 'job_id') and not kept[name]) then
      kept[name] = true
      record[#record + 1] = name
      record[#record + 1] = fields[i + 1]
    end
  end
  if wide then
    record[#record + 1] = 'jobd_fields'
    record[#record + 1] = tostring(#fields / 2)
  end
end
for i = first, #ARGV do record[#record + 1] = ARGV[i] end
record[#record + 1] = 'jobd_failed_at'
record[#record + 1] = tostring(now)
local record_id = redis.call('XADD', unpack(record))
if ARGV[5] ~= '' then
  redis.call('XTRIM', dead, 'MINID', tostring(now - tonumber(ARGV[5])) .. '-0')
end
redis.call('XACK', stream, group, id)
not_running(h, note.job, stream, id)
remember(h, note, now, id)
trim_history(h, now)
-- Only a mark that says the job is queued: a 'done' mark belongs to another copy that
-- completed, and must outlive this one's failure.
-- (pcall: a mark of another type is someone else's key, not a reason to fail after the ack.)
if KEYS[8] and redis.pcall('GET', KEYS[8]) == 'queued' then redis.call('DEL', KEYS[8]) end
redis.call('HINCRBY', KEYS[3], 'dead', 1)
redis.call('HINCRBY', KEYS[3], 'failed', 1)
redis.call('EXPIRE', KEYS[3], ARGV[6])
return record_id
