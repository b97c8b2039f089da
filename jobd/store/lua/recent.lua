--! uses cursor.lua
-- recent.lua: the jobs of a queue's history, latest record first, as the dashboard's "recent"
-- list shows them: each job's last record only, and of it only a few fields; a page goes on from
-- just past the last job shown (lib/cursor.lua: by its record's time and its job id, never by
-- index, which the jobs that ended meanwhile, theirs now first, would shift).
--
-- KEYS[1]  the history index (history:at: job id -> Redis ms of its latest record)
-- KEYS[2]  the history (job id -> its records, one JSON object a line, oldest first)
-- ARGV[1]  the cursor's score, as Redis writes one ('': from the latest), ARGV[2] its mark (the
--          job id, or its first bytes), ARGV[3] 1 when the mark is the whole job id
-- ARGV[4]  at most this many jobs
-- ARGV[5]  bytes of a field's text returned at most
--
-- Read-only: finding where to go on reads the log2 of the jobs of the cursor's time at most
-- (one ZRANGE … REV by index each), then a ZRANGE … REV by index, and one HGET a job (one job's
-- records, at most 64 KiB, in the script's memory at once). Returns {total, 1 when the index's
-- end was reached, rows}: each row {job id, ms, event, attempt, exit_code, signal, error,
-- duration_ms, consumer}: '' where the record does not say (or is no JSON object, or no record
-- is left).
local count, cap = tonumber(ARGV[4]), tonumber(ARGV[5])
local first = 0
if ARGV[1] ~= '' then first = resume(KEYS[1], ARGV[1], ARGV[2], ARGV[3] == '1', true) end
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
local total = redis.call('ZCARD', KEYS[1])
return {total, first + #ids / 2 >= total and 1 or 0, rows}
