
-- lib/record.lua: the copy of a job's entry that its dead-letter record keeps, as dead_letter.lua
-- writes it and record_copy.lua reads it for the on_dead_letter job's JSON (store/chains.py
-- json_pieces): one code, so that a record and its JSON never differ. Needs lib/jobs.lua before
-- it (MAX_FIELDS, batch_id_ok).

-- The jobd_ fields copied: each true (every occurrence), or the test of the value copied: its
-- last occurrence only, the value the daemon read (jobd.job; lib/jobs.lua sized), when it passes.
-- A batch is kept only when it is a batch id, by the rule of every batch link (batch_id_ok:
-- jobd.store.chains.KEPT builds the on_dead_letter job's JSON by the same), its incarnation
-- when no longer than jobd writes it.
local KEPT = {jobd_unique = true, jobd_parent = true, jobd_timeout = true, jobd_max_attempts = true,
  jobd_expires_at = true, jobd_batch = batch_id_ok,
  jobd_batch_incarnation = function(value) return #value <= 32 end}

-- Append to ``out`` the record's copy of an entry's flat fields {name, value, …}: its own fields
-- (those not starting with jobd_, and those KEPT), in the entry's order, each value longer than
-- ``clip`` bytes (nil: none) cut to its first ``clip`` bytes, then jobd_clipped naming each
-- field cut with its size ("payload 67108864"); more than MAX_FIELDS own fields (counted as
-- pairs, a repeated name each time) are too many to copy: only the first payload and the first
-- job_id are, then jobd_fields says how many fields the entry had. Returns ``out``. Bounded:
-- at most MAX_FIELDS pairs of ``clip`` bytes each, plus jobd_clipped (when ``clip`` is given).
local function record_copy(out, fields, clip)
  local own, last, clipped = {}, {}, {}
  for i = 1, #fields, 2 do
    if type(KEPT[fields[i]]) == 'function' then last[fields[i]] = i end
  end
  for i = 1, #fields, 2 do
    local name, kept = fields[i], KEPT[fields[i]]
    if string.sub(name, 1, 5) ~= 'jobd_' or kept == true or
        (last[name] == i and kept(fields[i + 1])) then
      own[#own + 1] = i
    end
  end
  local wide, seen = #own > MAX_FIELDS, {}
  for _, i in ipairs(own) do
    local name = fields[i]
    if not wide or ((name == 'payload' or name == 'job_id') and not seen[name]) then
      seen[name] = true
      local value = fields[i + 1]
      if clip and #value > clip then
        clipped[#clipped + 1] = name .. ' ' .. #value
        value = string.sub(value, 1, clip)
      end
      out[#out + 1] = name
      out[#out + 1] = value
    end
  end
  if #clipped > 0 then
    out[#out + 1] = 'jobd_clipped'
    out[#out + 1] = table.concat(clipped, ', ')
  end
  if wide then
    out[#out + 1] = 'jobd_fields'
    out[#out + 1] = tostring(#fields / 2)
  end
  return out
end
