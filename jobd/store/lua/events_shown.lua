--! uses shown.lua
-- events_shown.lua: a queue's events (its events stream) as the dashboard's feed shows them: at
-- most so many, newest first or oldest first from an id, of each its first fields only, each
-- name and value cut here, so a huge event never leaves Redis whole; and no event read once
-- those read hold so many bytes (lib/shown.lua entry_cost: each field FIELD_COST bytes more).
--
-- KEYS[1]  the events stream
-- ARGV[1]  'rev': the newest first (XREVRANGE from +); else oldest first, after ARGV[2]
-- ARGV[2]  the id after which events are read (exclusive): oldest first, from it; newest first,
--          down to it ('' : down to the first)
-- ARGV[3]  at most this many events
-- ARGV[4]  at most about this many bytes read: no event is read once those read hold this many;
--          a stream has no read of part of an entry, so one call reads at most this plus one
-- ARGV[5]  at most this many fields of an event returned (its first ones)
-- ARGV[6]  bytes of a field's name and of its value returned at most
--
-- Read-only; events are read one at a time (at most one whole event in the script's memory).
-- Returns {1 when it stopped at the bytes bound (events past the last returned, if any, were
-- not read), rows, bytes read (as counted: a caller sharing a budget takes them from it)}: each
-- row {id, fields it holds, name, value, length of the value, …}.
local rev, want, budget = ARGV[1] == 'rev', tonumber(ARGV[3]), tonumber(ARGV[4])
local most, cap = tonumber(ARGV[5]), tonumber(ARGV[6])
local from = rev and '+' or '(' .. ARGV[2]
local down = ARGV[2] == '' and '-' or '(' .. ARGV[2]
local rows, read = {}, 0
while #rows < want do
  if read >= budget then return {1, rows, read} end  -- those past the last returned: maybe more
  local row
  if rev then
    row = redis.call('XREVRANGE', KEYS[1], from, down, 'COUNT', 1)[1]
  else
    row = redis.call('XRANGE', KEYS[1], from, '+', 'COUNT', 1)[1]
  end
  if not row then break end
  read = read + entry_cost(row)
  local shown = {row[1], #row[2] / 2}
  for i = 1, math.min(#row[2], 2 * most), 2 do
    local value = row[2][i + 1]
    shown[#shown + 1] = string.sub(row[2][i], 1, cap)
    shown[#shown + 1] = string.sub(value, 1, cap)
    shown[#shown + 1] = #value
  end
  rows[#rows + 1] = shown
  from = '(' .. row[1]
end
return {0, rows, read}
