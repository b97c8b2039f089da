--! uses jobs.lua
-- delayed_shown.lua: a page of a delayed set as the dashboard shows it: by index from a cursor,
-- each member's due time, job id and attempt, cut here, so a member's payload never leaves
-- Redis; with a text to find, only the members whose job id holds it, looking at a bounded
-- number of members and bytes.
--
-- KEYS[1]  the queue's (or level's) delayed set
-- ARGV[1]  the first index (0: the soonest)
-- ARGV[2]  at most this many members returned
-- ARGV[3]  at most this many members looked at (the search's bound)
-- ARGV[4]  a text the job id must hold ('': every member)
-- ARGV[5]  at most about this many bytes read: no member is read once the members read hold
--          this many (one call reads at most this plus one member)
-- ARGV[6]  bytes of the job id and of the attempt returned at most
--
-- Read-only; members are read one at a time (ZRANGE i i). Returns {the index after the last
-- member looked at, 1 when the set's end was reached, rows}: each row {score, why ('' for a
-- job), job id cut (false: none, it runs under its entry id once due), its whole length,
-- attempt cut (false: none)}; a member that is not a job says why (promote.lua will
-- dead-letter it) and has no job id.
local index, want, looks = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local find, budget, cap = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local total = redis.call('ZCARD', KEYS[1])
local rows, looked, read = {}, 0, 0
while index < total and #rows < want and looked < looks and read < budget do
  local found = redis.call('ZRANGE', KEYS[1], index, index, 'WITHSCORES')
  if #found == 0 then break end
  index, looked, read = index + 1, looked + 1, read + #found[1]
  local job, why = decode_member(found[1])
  local row, jid = {found[2], why or '', false, 0, false}, ''
  if job then
    local fields = {}
    for i = 2, #job do fields[i - 1] = job[i] end
    jid = job_id_of('', fields)
    if jid ~= '' then row[3], row[4] = string.sub(jid, 1, cap), #jid end
    for i = 1, #fields, 2 do
      if fields[i] == 'jobd_attempt' then row[5] = string.sub(fields[i + 1], 1, cap) end
    end
  end
  if find == '' or (jid ~= '' and string.find(jid, find, 1, true)) then
    rows[#rows + 1] = row
  end
end
return {index, index >= total and 1 or 0, rows}
