-- dead_letters_shown.lua: the newest dead letters as the dashboard shows them: only the fields
-- it names, each cut to a size here, so a huge record never leaves Redis whole.
--
-- KEYS[1]  the dead-letter stream
-- ARGV[1]  at most this many records, newest first
-- ARGV[2…] pairs: a field name, and how many of its bytes to return (the first N; -N: the
--          last N)
--
-- Read-only. Records are read one at a time (at most one whole record in the script's memory).
-- Returns {{id, value, length, value, length, …}, …}: per field asked for, in order, its value
-- cut (false when the record has no such field) and its whole length in bytes.
local out = {}
local last = '+'
for _ = 1, tonumber(ARGV[1]) do
  local row = redis.call('XREVRANGE', KEYS[1], last, '-', 'COUNT', 1)[1]
  if not row then break end
  local fields = {}
  for i = 1, #row[2], 2 do
    fields[row[2][i]] = row[2][i + 1]
  end
  local shown = {row[1]}
  for i = 2, #ARGV, 2 do
    local value, cap = fields[ARGV[i]], tonumber(ARGV[i + 1])
    if value == nil then
      shown[#shown + 1] = false
      shown[#shown + 1] = 0
    else
      shown[#shown + 1] = cap < 0 and string.sub(value, cap) or string.sub(value, 1, cap)
      shown[#shown + 1] = #value
    end
  end
  out[#out + 1] = shown
  last = '(' .. row[1]
end
return out
