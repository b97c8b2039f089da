--! uses jobs.lua shown.lua cursor.lua
-- delayed_shown.lua: a page of a delayed set as the dashboard shows it: soonest first, from just
-- past the last member shown (lib/cursor.lua: by its score and mark, never by index, so members
-- promoted meanwhile shift nothing), each member's due time, job id and attempt, cut here, so a
-- member's payload never leaves Redis; with a text to find, only the members whose job id holds
-- it, looking at a bounded number of members and bytes.
--
-- KEYS[1]  the queue's (or level's) delayed set
-- ARGV[1]  the cursor's score, as Redis writes one ('': from the soonest member)
-- ARGV[2]  the cursor's mark: the first bytes of the last member shown, up to the end of its
--          unique id (``mark_of``), ARGV[3] 1 when that is the whole member
-- ARGV[4]  at most this many members returned
-- ARGV[5]  at most this many members looked at (the search's bound)
-- ARGV[6]  a text the job id must hold ('': every member)
-- ARGV[7]  at most about this many bytes read: no member is read once the members read hold
--          this many, each field a member holds (two values: its arrays' and maps' values, nested
--          ones too, counted from their headers, lib/shown.lua msgpack_width) counted FIELD_COST
--          bytes more; a member of more values than a job holds is not decoded; one call reads
--          at most this plus one member, and the log2 of the members sharing the cursor's score
--          that finding where to go on reads; one at least
-- ARGV[8]  bytes of the job id and of the attempt returned at most
--
-- Read-only; members are read one at a time (ZRANGE i i). Returns {1 when the set's end was
-- reached, rows, the score, mark and wholeness (1/0) of the last member looked at ('' when
-- none)}: each row {score, why ('' for a job), job id cut (false: none, it runs under its entry
-- id once due), its whole length, attempt cut (false: none)}; a member that is not a job says
-- why (promote.lua will dead-letter it) and has no job id.
local want, looks = tonumber(ARGV[4]), tonumber(ARGV[5])
local find, budget, cap = ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8])
local MARK_ID_MAX = 256 -- bytes of a unique id a mark holds at most
local WIDTH_MAX = 2 * MAX_FIELDS + 1 -- values a job's member holds at most: its id, fields

-- A member's mark: its bytes up to the end of its first element (the unique id) when that is a
-- string, never into the job's fields (a payload stays out of the page's cursor); else its
-- first 16 bytes. cmsgpack writes an array header (fixarray, array 16, array 32), then the
-- string's header (fixstr, str 8, str 16; bin 8 and bin 16 alike).
local function mark_of(member)
  local b, head = string.byte(member, 1) or 0, nil
  if b >= 0x90 and b <= 0x9f then head = 1 elseif b == 0xdc then head = 3 elseif b == 0xdd then head = 5
  else return string.sub(member, 1, 16) end
  local at = head + 1
  local c, size, len = string.byte(member, at) or 0, nil, nil
  if c >= 0xa0 and c <= 0xbf then
    size, len = 1, c - 0xa0
  elseif c == 0xd9 or c == 0xc4 then
    size, len = 2, string.byte(member, at + 1) or 0
  elseif c == 0xda or c == 0xc5 then
    size, len = 3, (string.byte(member, at + 1) or 0) * 256 + (string.byte(member, at + 2) or 0)
  else
    return string.sub(member, 1, 16)
  end
  return string.sub(member, 1, at + size - 1 + math.min(len, MARK_ID_MAX))
end

local index, read = 0, 0
if ARGV[1] ~= '' then index, read = resume(KEYS[1], ARGV[1], ARGV[2], ARGV[3] == '1', false) end
local total = redis.call('ZCARD', KEYS[1])
local rows, looked, last = {}, 0, {'', '', 0}
while index < total and #rows < want and looked < looks and (looked == 0 or read < budget) do
  local found = redis.call('ZRANGE', KEYS[1], index, index, 'WITHSCORES')
  if #found == 0 then break end
  -- Its values counted from msgpack's headers first (a map's, a nested array's too: decoding
  -- builds each), and a member holding more than a job can is not decoded at all.
  local width, job, why = msgpack_width(found[1], WIDTH_MAX), nil, nil
  if width > WIDTH_MAX then
    why = string.format('more than %d fields (jobd.job.MAX_FIELDS): %d values or more, not '
      .. 'decoded', MAX_FIELDS, width)
  else
    job, why = decode_member(found[1])
  end
  index, looked, read = index + 1, looked + 1, read + #found[1] + width * FIELD_COST / 2
  local mark = mark_of(found[1])
  last = {found[2], mark, #mark == #found[1] and 1 or 0}
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
return {index >= total and 1 or 0, rows, last[1], last[2], last[3]}
