--! uses shown.lua
-- running_shown.lua: a queue's active records (job id -> 'STREAM|ENTRY\n' and a JSON object:
-- its jobs running now, lib/jobs.lua) as the dashboard and `jobd status` read them: HSCAN
-- pages until so many records, or so many bytes, were read; a value longer than any record
-- jobd writes is not returned. Whatever the hash holds (100 000 records, a value of 500 MiB,
-- someone else's), one call reads a bounded part of it and says how many records it holds.
--
-- KEYS[1]  the queue's active hash
-- ARGV[1]  at most about this many records read (HSCAN pages of ARGV[4]: one page more at most)
-- ARGV[2]  at most about this many bytes read: no page is read once the records read hold this
--          many (names and values, and FIELD_COST a record: lib/shown.lua); at most this plus
--          one page
-- ARGV[3]  bytes of a value returned at most (a longer one: false, and its length)
-- ARGV[4]  HSCAN's COUNT: records a page holds, about (a small hash comes in one page)
--
-- Read-only. Returns {records the hash holds (HLEN), 1 when every one was read, rows}: each
-- row {job id, value (false: longer than ARGV[3]), its length}. A key of another type: the
-- script fails (WRONGTYPE), as a read of it would.
local most, budget, cap = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local total = redis.call('HLEN', KEYS[1])
local rows, read, seen, cursor = {}, 0, {}, '0'
repeat
  local page = redis.call('HSCAN', KEYS[1], cursor, 'COUNT', ARGV[4])
  cursor = page[1]
  for i = 1, #page[2], 2 do
    local name, value = page[2][i], page[2][i + 1]
    if not seen[name] then  -- HSCAN may name a field twice (never here: nothing writes meanwhile)
      seen[name] = true
      read = read + #name + #value + FIELD_COST
      rows[#rows + 1] = {name, #value <= cap and value or false, #value}
    end
  end
until cursor == '0' or #rows >= most or read >= budget
return {total, cursor == '0' and 1 or 0, rows}
