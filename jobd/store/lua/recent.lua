-- recent.lua: the jobs of a queue's history, latest record first, as the dashboard's "recent"
-- list shows them: each job's last record only, and of it only a few fields.
--
-- KEYS[1]  the history index (history:at: job id -> Redis ms of its latest record)
-- KEYS[2]  the history (job id -> its records, one JSON object a line, oldest first)
-- ARGV[1]  the first index (0: the latest), ARGV[2] at most this many jobs
-- ARGV[3]  bytes of a field's text returned at most
--
-- Read-only: a ZRANGE … REV by index, then one HGET a job (one job's records, at most 64 KiB,
-- in the script's memory at once). Returns {total, rows}: each row {job id, ms, event, attempt,
-- exit_code, signal, error, duration_ms, consumer}: '' where the record does not say (or is no
-- JSON object, or no record is left).
local first, count, cap = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local ids = redis.call('ZRANGE', KEYS[1], first, first + count - 1, 'REV', 'WITHSCORES')
local names = {'event', 'attempt', 'exit_code', 'signal', 'error', 'duration_ms', 'consumer'}
local rows = {}
for i = 1, #ids, 2 do
  local row = {ids[i], ids[i + 1]}
  local blob = redis.call('HGET', KEYS[2], ids[i])
  local record = nil
  if blob then
    local line = string.match(blob, '([^\n]*)\n?$')
    local ok, decoded = pcall(cjson.decode, line or '')
    if ok and type(decoded) == 'table' then record = decoded end
  end
  for _, name in ipairs(names) do
    local value = record and record[name]
    if type(value) == 'number' then value = string.format('%.17g', value) end
    if type(value) ~= 'string' then value = '' end
    row[#row + 1] = string.sub(value, 1, cap)
  end
  rows[#rows + 1] = row
end
return {redis.call('ZCARD', KEYS[1]), rows}
