-- lib/shown.lua: an entry as the dashboard shows it (entries_shown.lua, dead_letters_shown.lua).

-- The entry ``row`` (XRANGE's {id, {name, value, ...}}) as {id, value, size, ...}: for each pair
-- of ARGV from ``from`` on (a field's name, how much of it: N bytes from its start, or -N from
-- its end), the field's value cut so (false when it has none) and its whole size. Its fields
-- by name are returned too, and the bytes the entry holds (its names and values: what reading
-- it cost, a stream having no read of a part of a field).
local function shown_row(row, from)
  local fields, size = {}, #row[1]
  for i = 1, #row[2], 2 do
    fields[row[2][i]] = row[2][i + 1]
    size = size + #row[2][i] + #row[2][i + 1]
  end
  local shown = {row[1]}
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
