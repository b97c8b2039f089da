-- lib/shown.lua: what the dashboard's reads share: what reading costs (counted in bytes, against
-- a budget), an entry as the dashboard shows it (entries_shown.lua, dead_letters_shown.lua), a
-- hash read to a bound, weighed first (running_shown.lua, hashes_shown.lua), how many values a
-- msgpack value holds, read from its headers without decoding it (delayed_shown.lua).

-- What reading one field costs besides its bytes, counted as bytes: the reply's headers for its
-- name and value, two Lua strings and a table slot. An entry of 100 000 empty fields holds a
-- few bytes and costs Redis as much as one of 6 MiB to read.
local FIELD_COST = 64 -- jobd.store.browse.FIELD_COST

-- What reading the field (or hash field) ``name``, ``value`` costs the budget.
local function field_cost(name, value)
  return #name + #value + FIELD_COST
end

-- What reading the stream entry ``row`` (XRANGE's {id, {name, value, ...}}) costs the budget:
-- its id and each of its fields (a name may repeat: each counts).
local function entry_cost(row)
  local size = #row[1]
  for i = 1, #row[2], 2 do size = size + field_cost(row[2][i], row[2][i + 1]) end
  return size
end

-- The entry ``row`` as {id, fields, value, size, ...}: its number of fields (name, value pairs,
-- counted as they are: a name may repeat), then for each pair of ARGV from ``from`` on (a
-- field's name, how much of it: N bytes from its start, or -N from its end), the field's value
-- cut so (false when it has none) and its whole size. Its fields by name are returned too, and
-- what reading it cost (``entry_cost``: a stream having no read of a part of an entry).
local function shown_row(row, from)
  local fields = {}
  for i = 1, #row[2], 2 do fields[row[2][i]] = row[2][i + 1] end
  local shown = {row[1], #row[2] / 2}
  for i = from, #ARGV, 2 do
    local value, cap = fields[ARGV[i]], tonumber(ARGV[i + 1])
    if value == nil then
      shown[#shown + 1] = false
      shown[#shown + 1] = 0
    else
      shown[#shown + 1] = cap < 0 and string.sub(value, cap) or string.sub(value, 1, cap)
      shown[#shown + 1] = #value
    end
  end
  return shown, fields, entry_cost(row)
end

-- The bytes the hash ``key`` holds when Redis keeps it as a listpack (a ziplist before 7.0),
-- from MEMORY USAGE (the listpack's allocation: no walk); nil for a table. Redis checks
-- hash-max-listpack-entries and -value only on writes, and never converts back: a hash written
-- under a higher bound, or RESTOREd, stays a listpack whatever its values hold, and HSCAN returns
-- a listpack whole in one page whatever its COUNT.
local LISTPACK = {listpack = true, ziplist = true}
local function listpack_bytes(key)
  if LISTPACK[redis.call('OBJECT', 'ENCODING', key)] then
    return redis.call('MEMORY', 'USAGE', key, 'SAMPLES', 0)
  end
  return nil
end

-- The hash ``key`` read to about ``most`` fields and ``budget`` bytes (``field_cost`` each),
-- whatever a name or value holds, the same part of it at each read. Each reply is weighed in
-- Redis before it is asked, copying nothing: HSCAN, HGETALL and HRANDFIELD answer whole names
-- (and values) into the script, and either may be of any size (anyone can HSET one: a value of 64 MiB held Redis 0.4 s, a name of 64 MiB 0.3 s).
-- A hash kept as a listpack weighs its allocation (``listpack_bytes``): read in one HSCAN page
-- (values and all) when that is ``budget`` bytes or less, else not at all. A table weighs its
-- MEMORY USAGE with SAMPLES 0 (Redis walks every field, adding its name's and value's
-- allocations, nothing copied): its names are read only when it holds NAMES_MOST fields or
-- fewer and weighs no more than its fields would if jobd wrote each at its largest
-- (``names_bound``: HLEN fields of a NAME_MOST-byte name and a ``cap``-byte value), or than
-- ``most`` fields of ``cap`` bytes, NAMES_WEIGHED at least. The weight is of the whole hash,
-- values too, not of the ``most`` fields a read takes: bounded by ``most`` alone, 2 500 of
-- jobd's running records (1 KiB job ids, 1 KiB status lines of control bytes, escaped: 6.3
-- KiB each, 20 MiB) read none. Of jobd's own fields the names copied are NAME_MOST bytes each,
-- 10 MiB at most (10 000 records of 1 KiB ids and 16 KiB values, 169 MiB: 45 ms a read); nothing
-- in Redis 7.0 weighs names apart from values, so a hash someone HSET with names as heavy as
-- jobd's records (10 000 names of 17 000 bytes, 196 MiB) has them copied: 0.83 s a read. Only a
-- client that can write jobd's hashes can (not a producer: docs/security.md). The names are
-- read by HRANDFIELD with the HLEN (every name, no value; HKEYS would too, but is not among
-- the commands jobd's ACL user has), then sorted, so a read
-- takes the first ``most`` names in byte order (not a sample: the same ones from one read to
-- the next), each value's length (HSTRLEN), and the values within ``cap`` bytes in HMGETs of
-- ``count`` names, until ``budget`` bytes were read (one field past it at most: ``cap`` bytes
-- and its name). Weighing a table walks it (NAMES_MOST fields at most: about 1 ms).
-- Returns {fields the hash holds (HLEN), 1 when every one was read, rows}: each row {name (cut
-- to ``cap`` bytes), value (false: it or its name is longer than ``cap`` bytes), the value's
-- length}; no rows when the hash weighs too much. A key of another type: the script fails
-- (WRONGTYPE), as a read of it would.
local NAMES_MOST = 10000 -- fields: a queue's active hash holds one a running job
local NAMES_WEIGHED = 4194304 -- bytes, at least: 10 000 records of 300 bytes weigh about 4 MiB
local NAME_MOST = 1024 -- jobd.job.MAX_JOB_ID: bytes of a name jobd writes (a job id at most)
-- The MEMORY USAGE a table of ``total`` fields may have when jobd wrote each (names of NAME_MOST
-- bytes, values of ``cap``: each allocation rounded up to its size class, a quarter more at
-- most, and its entry, FIELD_COST), or of ``most`` fields of ``cap`` bytes; NAMES_WEIGHED at
-- least.
local function names_bound(total, most, cap)
  local field = (NAME_MOST + cap) * 5 / 4 + FIELD_COST
  return math.max(NAMES_WEIGHED, most * cap, total * field)
end
local function hash_read(key, most, budget, cap, count)
  local total = redis.call('HLEN', key)
  local rows, read = {}, 0
  if total == 0 then return {0, 1, rows} end
  local packed = listpack_bytes(key)
  if packed then
    if packed > budget then return {total, 0, rows} end
    local page = redis.call('HSCAN', key, '0', 'COUNT', total) -- a listpack: one page, whole
    for i = 1, #page[2], 2 do
      local name, value = page[2][i], page[2][i + 1]
      local fits = #value <= cap and #name <= cap
      rows[#rows + 1] = {string.sub(name, 1, cap), fits and value, #value}
    end
    return {total, #rows >= total and 1 or 0, rows}
  end
  if total > NAMES_MOST
      or redis.call('MEMORY', 'USAGE', key, 'SAMPLES', 0) > names_bound(total, most, cap)
  then
    return {total, 0, rows}
  end
  local names = redis.call('HRANDFIELD', key, total) -- every name: the whole hash
  table.sort(names)
  local asked, wanted = {}, {} -- names whose values are to be read, and their rows
  local function flush() -- the values of ``asked`` in one HMGET
    if #asked == 0 then return end
    local values = redis.call('HMGET', key, unpack(asked))
    for j, row in ipairs(wanted) do row[2] = values[j] or false end
    asked, wanted = {}, {}
  end
  for i = 1, math.min(#names, most) do
    if read >= budget then break end
    local name = names[i]
    local length = redis.call('HSTRLEN', key, name)
    local row = {string.sub(name, 1, cap), false, length}
    rows[#rows + 1] = row
    read = read + #name + FIELD_COST
    if length <= cap and #name <= cap then
      asked[#asked + 1], wanted[#wanted + 1] = name, row
      read = read + length
      if #asked >= tonumber(count) then flush() end
    end
  end
  flush()
  return {total, #rows >= total and 1 or 0, rows}
end

-- The field ``name`` of hash ``key`` as ``hash_read`` returns it (its name known: no name is
-- copied): {fields the hash holds, 1, rows}, rows {name, value (false: longer than ``cap``),
-- its length} or none when the hash has no such field. A key of another type: WRONGTYPE.
local function hash_field(key, name, cap)
  local total = redis.call('HLEN', key)
  local length = redis.call('HSTRLEN', key, name)
  if length == 0 and redis.call('HEXISTS', key, name) == 0 then return {total, 1, {}} end
  local value = length <= cap and redis.call('HGET', key, name)
  return {total, 1, {{name, value, length}}}
end

-- How many values the msgpack value at the start of ``blob`` holds, counted from the headers of
-- its arrays and maps (a map's pair: two; nested ones too), without decoding it: each header is
-- read at most, never a string's bytes (skipped by their length). Stops once the count passes
-- ``most`` (a value of 100 000 empty strings is told by its first header) and returns it then;
-- else the whole count. A byte that starts no msgpack value (0xc1), or the end of ``blob``,
-- stops the count too (cmsgpack refuses such a value: decoding it stops there).
local MSGPACK_SKIP = { -- bytes after the type byte, for a fixed-size value
  [0xc0] = 0, [0xc2] = 0, [0xc3] = 0, [0xca] = 4, [0xcb] = 8, [0xcc] = 1, [0xcd] = 2,
  [0xce] = 4, [0xcf] = 8, [0xd0] = 1, [0xd1] = 2, [0xd2] = 4, [0xd3] = 8, [0xd4] = 2,
  [0xd5] = 3, [0xd6] = 5, [0xd7] = 9, [0xd8] = 17,
}
local function msgpack_width(blob, most)
  local at, left, count = 1, 1, 0  -- left: values still to skip; count: values held in all
  local function be(n) -- the big-endian number of n bytes after the type byte
    local v = 0
    for i = 1, n do v = v * 256 + (string.byte(blob, at + i) or 0) end
    return v
  end
  while left > 0 and at <= #blob do
    local b = string.byte(blob, at)
    left = left - 1
    local items, size, head = 0, 0, 1 -- nested values, bytes of a string, header's length
    if b <= 0x7f or b >= 0xe0 then
    elseif b >= 0x80 and b <= 0x8f then items = 2 * (b - 0x80)
    elseif b >= 0x90 and b <= 0x9f then items = b - 0x90
    elseif b >= 0xa0 and b <= 0xbf then size = b - 0xa0
    elseif b == 0xc4 or b == 0xd9 then size, head = be(1), 2
    elseif b == 0xc5 or b == 0xda then size, head = be(2), 3
    elseif b == 0xc6 or b == 0xdb then size, head = be(4), 5
    elseif b == 0xc7 then size, head = be(1) + 1, 2
    elseif b == 0xc8 then size, head = be(2) + 1, 3
    elseif b == 0xc9 then size, head = be(4) + 1, 5
    elseif b == 0xdc then items, head = be(2), 3
    elseif b == 0xdd then items, head = be(4), 5
    elseif b == 0xde then items, head = 2 * be(2), 3
    elseif b == 0xdf then items, head = 2 * be(4), 5
    elseif MSGPACK_SKIP[b] then head = 1 + MSGPACK_SKIP[b]
    else break end
    count, left, at = count + items, left + items, at + head + size
    if count > most then break end
  end
  return count
end
