-- dead_letter_find.lua: the id of a dead letter named by an operator (`jobd dlq show`,
-- `requeue`), found in Redis: no record leaves it, whatever its size.
--
-- KEYS[1]  the dead-letter stream
-- ARGV[1]  'id': is there a record of id ARGV[2]; 'job': the newest record whose jobd_job_id is
--          ARGV[2] (any bytes), looked for from ARGV[3] ('+', or '(' .. id: before it) down,
--          at most ARGV[4] records visited in this call, and no record visited once those
--          visited hold ARGV[5] bytes (one at least; each field counted FIELD_COST more: 100 000
--          empty fields cost as 6 MiB): a stream entry is read whole, payload and all, so each
--          call holds Redis while it copies them, whatever their size
--
-- Read-only. Records are read one at a time (one whole record in the script's memory at most).
-- Returns {the record's id (false: none found), the last id visited when the call stopped at
-- its bound without finding it (go on before it), else false}.
local dead = KEYS[1]
if ARGV[1] == 'id' then
  local rec = redis.pcall('XRANGE', dead, ARGV[2], ARGV[2], 'COUNT', 1)
  if type(rec) == 'table' and not rec.err and rec[1] then return {rec[1][1], false} end
  return {false, false}
end
local FIELD_COST = 64 -- jobd.store.browse.FIELD_COST: what a field costs besides its bytes
local job, from, budget, read = ARGV[2], ARGV[3], tonumber(ARGV[5]), 0
for _ = 1, tonumber(ARGV[4]) do
  local rec = redis.call('XREVRANGE', dead, from, '-', 'COUNT', 1)[1]
  if not rec then return {false, false} end
  local fields = rec[2]
  for j = 1, #fields, 2 do
    if fields[j] == 'jobd_job_id' and fields[j + 1] == job then return {rec[1], false} end
    read = read + #fields[j] + #fields[j + 1] + FIELD_COST
  end
  from = '(' .. rec[1]
  if read >= budget then break end
end
return {false, string.sub(from, 2)}
