-- lib/shown.lua: an entry as the dashboard shows it (entries_shown.lua, dead_letters_shown.lua).

-- What reading one field costs besides its bytes, counted as bytes: the reply's headers for its
-- name and value, two Lua strings and a table slot. An entry of 100 000 empty fields holds a
-- few bytes and costs Redis as much as one of 6 MiB to read.
local FIELD_COST = 64 -- jobd.store.browse.FIELD_COST

-- The entry ``row`` (XRANGE's {id, {name, value, ...}}) as {id, fields, value, size, ...}: its
-- number of fields (name, value pairs, counted as they are: a name may repeat), then for each
-- pair of ARGV from ``from`` on (a field's name, how much of it: N bytes from its start, or -N
-- from its end), the field's value cut so (false when it has none) and its whole size. Its
-- fields by name are returned too, and what reading it cost (its names and values, and
-- FIELD_COST a field: a stream having no read of a part of an entry).
local function shown_row(row, from)
  local fields, size = {}, #row[1]
  for i = 1, #row[2], 2 do
    fields[row[2][i]] = row[2][i + 1]
    size = size + #row[2][i] + #row[2][i + 1] + FIELD_COST
  end
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
  return shown, fields, size
end
