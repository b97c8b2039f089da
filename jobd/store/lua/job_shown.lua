-- job_shown.lua: a job's records (its history) and its active record, as `jobd job` and the
-- dashboard's lookup read them: each only when its length (HSTRLEN) is within a bound, so a
-- value someone else wrote (100 MiB under a job id) never leaves Redis, nor is copied in it.
--
-- KEYS[1]  the history (job id -> its records, one JSON object a line, oldest first)
-- KEYS[2]  the active hash (job id -> its running record)
-- KEYS[3]  (optional) the after hash (job id -> what a held job waits for: hold.lua)
-- ARGV[1]  the job id
-- ARGV[2]  bytes of records read at most (jobd keeps HISTORY_BYTES a job, or one record alone
--          larger, a result's: well under this)
-- ARGV[3]  bytes of an active record read at most
-- ARGV[4]  with KEYS[3], bytes of its value read at most
--
-- Read-only. Returns {records (false: none, or longer than ARGV[2]), their length, active record
-- (false: none, or longer than ARGV[3]), its length[, after value, its length]}. A key of
-- another type: that one reads as none (its length 0), as a failed read of it did.
local out = {}
for i, key in ipairs(KEYS) do
  local kind, most = redis.call('TYPE', key).ok, tonumber(ARGV[i + 1])
  local size, value = 0, false
  if kind == 'hash' then
    size = redis.call('HSTRLEN', key, ARGV[1])
    if size > 0 and size <= most then value = redis.call('HGET', key, ARGV[1]) end
  end
  out[#out + 1] = value
  out[#out + 1] = size
end
return out
