--! uses shown.lua
-- dead_letters_shown.lua: the newest dead letters as the dashboard shows them: only the fields
-- it names, each cut to a size here, so a huge record never leaves Redis whole.
--
-- KEYS[1]  the dead-letter stream
-- ARGV[1]  at most this many records, newest first
-- ARGV[2]  at most about this many bytes read: no record is read once the records read hold
--          this many, each field counted FIELD_COST bytes more than its name and value
--          (lib/shown.lua); a record is read whole: one call reads at most this plus one record
-- ARGV[3…] pairs: a field name, and how many of its bytes to return (the first N; -N: the
--          last N)
--
-- Read-only. Records are read one at a time (at most one whole record in the script's memory).
-- Returns {{id, fields, value, length, value, length, …}, …}: how many fields the record holds,
-- then per field asked for, in order, its value cut (false when the record has no such field)
-- and its whole length in bytes.
local out = {}
local last, read, budget = '+', 0, tonumber(ARGV[2])
for _ = 1, tonumber(ARGV[1]) do
  if read >= budget then break end
  local row = redis.call('XREVRANGE', KEYS[1], last, '-', 'COUNT', 1)[1]
  if not row then break end
  local shown, _, size = shown_row(row, 3)
  out[#out + 1] = shown
  read = read + size
  last = '(' .. row[1]
end
return out
