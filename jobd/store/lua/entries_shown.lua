--! uses jobs.lua shown.lua
-- entries_shown.lua: a page of a stream as the dashboard shows it (waiting jobs, dead letters):
-- from a cursor, at most so many entries, only the fields it names, each cut to a size here, so
-- a huge entry never leaves Redis whole; with a text to find, only the entries whose job id
-- holds it, looking at a bounded number of entries.
--
-- KEYS[1]  the stream
-- ARGV[1]  the first id (exclusive: '(' .. id), or '-' / '+' (its start or end)
-- ARGV[2]  the last id, or '+' / '-'
-- ARGV[3]  'rev': newest first (XREVRANGE: ARGV[1] is then the upper end), else oldest first
-- ARGV[4]  at most this many entries returned
-- ARGV[5]  at most this many entries looked at (the search's bound; ARGV[4] without a search)
-- ARGV[6]  a text the job id must hold ('' : every entry); the job id as jobd runs the entry
--          (lib/jobs.lua job_id_of: job_id, else jobd_job_id, else the entry's id)
-- ARGV[7]  at most about this many bytes read: no entry is read once the entries read hold this
--          many, each field counted FIELD_COST bytes more than its name and value (lib/shown.lua:
--          100 000 empty fields cost as much as 6 MiB); a stream has no read of part of a field:
--          an entry is read whole, so one call reads at most this plus one entry
-- ARGV[8…] pairs: a field name, and how many of its bytes to return (the first N; -N: the last N)
--
-- Read-only. Entries are read one at a time (at most one whole entry in the script's memory).
-- Returns {last id looked at (false: none), 1 when the end of the range was reached, rows}:
-- each row {id, fields, value, length, …}: how many fields the entry holds, then per field
-- asked for, in order, its value cut (false when the entry has no such field) and its whole
-- length in bytes. A page that stops at its count looks
-- whether the range goes on (one entry more read) only while under the bytes bound; past it the
-- range is said to go on (the next page may be empty).
local rev = ARGV[3] == 'rev'
local want, looks, find = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
local budget = tonumber(ARGV[7])
local from, to = ARGV[1], ARGV[2]
local function next_entry()
  if rev then return redis.call('XREVRANGE', KEYS[1], from, to, 'COUNT', 1)[1] end
  return redis.call('XRANGE', KEYS[1], from, to, 'COUNT', 1)[1]
end
local rows, last, ended, looked, read = {}, false, 1, 0, 0
while true do
  if read >= budget then
    ended = 0  -- the bytes bound: the cursor goes on
    break
  end
  if #rows >= want or looked >= looks then
    ended = next_entry() and 0 or 1  -- a page that ends the range says so
    break
  end
  looked = looked + 1
  local row = next_entry()
  if not row then ended = 1 break end
  ended = 0
  last = row[1]
  from = '(' .. row[1]
  local shown, _, size = shown_row(row, 8)
  read = read + size
  if find == '' or string.find(job_id_of(row[1], row[2]), find, 1, true) then
    rows[#rows + 1] = shown
  end
end
return {last, ended, rows}
