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
-- ARGV[6]  bytes of records read at most: a job's records are read only while those read hold
--          less (their length is known first, HSTRLEN); a job's records longer than this alone
--          are never read (jobd keeps 64 KiB a job: someone else wrote them), only their length
--
-- Read-only: finding where to go on reads the log2 of the jobs of the cursor's time at most
-- (one ZRANGE … REV by index each), then a ZRANGE … REV by index, and one HSTRLEN and at most
-- one HGET a job. The last line of a job's records is found backwards from their end, in C
-- (string.reverse, a plain string.find): linear in their length, whatever they hold (an
-- unanchored string.match of '([^\n]*)\n?$' tried every position, each to its line's end:
-- quadratic in a line's length). Returns {total, 1 when the index's end was reached, rows}:
-- each row {job id, ms, length of its records when not read (0: read, or none), event, attempt,
-- exit_code, signal, error, duration_ms, consumer}: '' where the record does not say (or is no
-- JSON object, or no record is left). A page that stops at the bytes bound has fewer rows than
-- asked for; the next goes on past the last one.
local count, cap, budget = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local first = 0
if ARGV[1] ~= '' then first = resume(KEYS[1], ARGV[1], ARGV[2], ARGV[3] == '1', true) end
local ids = redis.call('ZRANGE', KEYS[1], first, first + count - 1, 'REV', 'WITHSCORES')
local names = {'event', 'attempt', 'exit_code', 'signal', 'error', 'duration_ms', 'consumer'}

-- The last line of ``blob`` (a newline at its very end ends that line, as in a file).
local function last_line(blob)
  local stop = #blob
  if string.byte(blob, stop) == 10 then stop = stop - 1 end
  local body = string.sub(blob, 1, stop)
  local back = string.find(string.reverse(body), '\n', 1, true)
  if not back then return body end
  return string.sub(body, stop - back + 2)
end

local rows, read = {}, 0
for i = 1, #ids, 2 do
  local size = redis.call('HSTRLEN', KEYS[2], ids[i])
  if #rows > 0 and size <= budget and read + size > budget then break end
  local row, record = {ids[i], ids[i + 1], 0}, nil
  if size > budget then
    row[3] = size
  elseif size > 0 then
    read = read + size
    local ok, decoded = pcall(cjson.decode, last_line(redis.call('HGET', KEYS[2], ids[i])))
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
return {total, first + #rows >= total and 1 or 0, rows}
