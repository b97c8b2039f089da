--! uses shown.lua group.lua
-- hashes_shown.lua: small hashes of a queue as `jobd status` and the dashboard read them (the
-- consumers waiting for a limit, the per-minute counters, the rate bucket, the pause), each read
-- to a bound whatever it holds: anyone who can write to Redis can add fields, or values of any
-- size, to them. A hash of open fields is read to a bound, its names first, then only the
-- values within the cap (lib/shown.lua hash_read); one of known fields, only those, each only
-- when its length (HSTRLEN) is within the cap (never read otherwise), or whole when Redis keeps
-- it as a small listpack (below).
-- The queue's stream may be one of the keys too: its consumer group is read (lib/group.lua: no
-- entry of the stream copied), in the same round trip.
--
-- KEYS     the hashes (one slot: a queue's keys)
-- ARGV[1]  fields of a hash read at most (a sample of them when it holds more: hash_read)
-- ARGV[2]  bytes of a hash read at most, about (names and values, and FIELD_COST a field: one
--          field more at most)
-- ARGV[3]  bytes of a name or value returned at most (a longer value: never read; false, and
--          its length)
-- ARGV[4]  fields whose values one HMGET reads
-- ARGV[5…] per key, what to read of it: '*' (every field, to the bounds), or its field names,
--          separated by spaces; of a stream, '>' (the group and its consumers: listed when
--          ARGV[1] or fewer, each name cut to ARGV[3] bytes) or '=' (the group alone), then the
--          group's name
--
-- Read-only. Returns, per key, {1, fields the hash holds (HLEN), 1 when every one was read,
-- then name, value, name, value, …} (a value false: longer than ARGV[3]; of known fields, those
-- it has), or {0, why} for a key of another type (someone else's); of a stream, what
-- lib/group.lua's group_read says.
local most, budget, cap = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])

-- The fields ``names`` (separated by spaces) of hash ``key``, added to ``out`` as name, value
-- pairs (those it has; a value false: longer than the cap). A hash Redis keeps as a listpack
-- holding WHOLE bytes or less (``listpack_bytes``: jobd's counters and histograms hold well
-- under 1 KiB) is read whole in one HGETALL, its other fields dropped here. Of any other (a
-- table, or a listpack holding more: Redis checks its listpack bounds only on writes, so one
-- can hold values of any size), each field's length first (HSTRLEN), then those within the cap
-- in one HMGET; a longer one is never read.
local WHOLE = 4096
local WANTED = {} -- the names of a spec, as a set, by its text (the same spec for many keys)
local function known(key, names, out)
  local packed = listpack_bytes(key)
  if packed and packed <= WHOLE then
    local flat, wanted = redis.call('HGETALL', key), WANTED[names]
    if not wanted then
      wanted = {}
      for name in string.gmatch(names, '%S+') do wanted[name] = true end
      WANTED[names] = wanted
    end
    for i = 1, #flat, 2 do
      if wanted[flat[i]] then
        out[#out + 1] = flat[i]
        out[#out + 1] = #flat[i + 1] <= cap and flat[i + 1]
      end
    end
    return
  end
  local asked = {}
  for name in string.gmatch(names, '%S+') do
    if redis.call('HSTRLEN', key, name) > cap then
      out[#out + 1] = name
      out[#out + 1] = false
    else
      asked[#asked + 1] = name
    end
  end
  if #asked > 0 then
    local values = redis.call('HMGET', key, unpack(asked))
    for j, name in ipairs(asked) do
      if values[j] then
        out[#out + 1] = name
        out[#out + 1] = values[j]
      end
    end
  end
end

-- Hash ``key`` as ``spec`` asks (above).
local function hash_shown(key, spec)
  local total = redis.pcall('HLEN', key)
  if type(total) == 'table' then  -- WRONGTYPE: someone else's key
    return {0, 'WRONGTYPE the key holds a ' .. redis.call('TYPE', key).ok .. ', not a hash'}
  elseif total == 0 then
    return {1, 0, 1}
  elseif spec == '*' then
    local found = hash_read(key, most, budget, cap, ARGV[4])
    local out = {1, found[1], found[2]}
    for _, row in ipairs(found[3]) do
      out[#out + 1] = row[1]
      out[#out + 1] = row[2]
    end
    return out
  end
  local out = {1, total, 1}
  known(key, spec, out)
  return out
end

local out = {}
for i, key in ipairs(KEYS) do
  local spec = ARGV[4 + i]
  local kind = string.sub(spec, 1, 1)
  if kind == '>' or kind == '=' then  -- a stream: its group
    out[i] = group_read(key, string.sub(spec, 2), most, cap, kind == '>')
  else
    out[i] = hash_shown(key, spec)
  end
end
return out
