-- daemons_listed.lua: the daemon registry as `jobd status` and the dashboard list it
-- (jobd/store/registry.py ``listing``), in one call on the registry's node: its clock, the
-- daemons with the newest beats (the live ones), listed oldest first, and of each record only
-- the fields named, each read only when no longer than its bound. Whatever someone else wrote
-- in the registry (a field of 30 MiB, a name of any length, thousands of entries, beats at
-- +inf), a listing moves a bounded number of bytes and lists the daemons that beat last.
--
-- KEYS[1]  {jobd:daemons}  sorted set: consumer name -> last beat (Redis ms)
-- ARGV[1]  at most this many daemons listed (the newest beats not ahead of the clock)
-- ARGV[2]  the prefix of a record's key ({jobd:daemons}:daemon:): NAME's is prefix .. NAME, in
--          KEYS[1]'s slot (the hash tag)
-- ARGV[3]  bytes of a daemon's name returned at most
-- ARGV[4]  ms ahead of this clock a beat may be and still be listed (a clock stepped back); an
--          entry further ahead (+inf, a time to come) was written by no daemon: counted only
-- ARGV[5]  at most this many bytes of fields read in all (the newest beats' first): a field
--          that would pass it is not read (its length returned negative)
-- ARGV[6]  bytes of the longest name jobd writes: a longer name's record is not read (its type
--          returned as 'long'), and its key is never made. Names are read up to ARGV[1] names
--          this long in all (one name more at most): past it, no more entries are listed
-- ARGV[7]  a field many records hold alike (queues: a fleet's daemons serve the same), and
-- ARGV[8]  the field holding its digest (a SHA-1 in hex, written with it): of the records whose
--          digest is the same, the field is read (and counted) once, in the newest beat's row
--          whose field has that digest (redis.sha1hex: anyone may write any digest); a row whose
--          field does not (or has none) is returned with no digest, its own field read
-- ARGV[9…] pairs: a field of a record, and the most bytes of it read (a longer one is not read)
--
-- Names are read one at a time, by rank (ZRANGE … REV, rank to rank: O(log n) each, one call of
-- the script in all): Redis has no read of a member's length, so a name can only be read whole
-- (a member may be 512 MB), and a page of more than one could hold as many names of any length.
-- Read one by one, names are read up to ARGV[1] × ARGV[6] bytes, plus one name at most: the one
-- that passes them (of any length, written by no daemon), after which no more entries are
-- listed and ``spent`` says so. jobd's names never pass them.
--
-- Read-only. Returns {'ok', now_ms, total, rows, ahead, spent} or {'wrongtype', type of
-- KEYS[1]}: the entries in all, those ahead (not listed), and 1 when the bytes for names were
-- spent before every entry was listed. Each row: {name (cut), its length, its score as Redis writes
-- it, the record's type ('none': gone; 'long': not read), ARGV[7]'s digest (false: none),
-- value, length, …}: per field named, its value (false: none, or longer than its bound and not
-- read, or ARGV[7] read in a row of the same digest) and its length in bytes.
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'zset' and kind ~= 'none' then return {'wrongtype', kind} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local top = string.format('%d', now + tonumber(ARGV[4]))
local listed, cut, budget = tonumber(ARGV[1]), tonumber(ARGV[3]), tonumber(ARGV[5])
local most, read, alike, digests = tonumber(ARGV[6]), 0, ARGV[7], {}
-- The row of entry ``name`` (its last beat ``score``): its fields read, counted in ``read``.
local function row_of(name, score)
  local record = #name <= most and ARGV[2] .. name or nil
  local row = {string.sub(name, 1, cut), #name, score,
    record and redis.call('TYPE', record)['ok'] or 'long', false}
  if row[4] == 'hash' and redis.call('HSTRLEN', record, ARGV[8]) == 40 then
    row[5] = redis.call('HGET', record, ARGV[8])
  end
  for f = 9, #ARGV, 2 do
    local value, size = false, 0
    if row[4] == 'hash' and ARGV[f] == alike and row[5] and digests[row[5]] then
      size = 0  -- read already, in a newer row of the same digest
    elseif row[4] == 'hash' then
      size = redis.call('HSTRLEN', record, ARGV[f])
      if size <= tonumber(ARGV[f + 1]) then
        if size > 0 and read + size > budget then
          size = -size
        else
          read = read + size
          value = redis.call('HGET', record, ARGV[f])
          if ARGV[f] == alike and row[5] then  -- shared only when it has the digest named
            if value and redis.sha1hex(value) == row[5] then
              digests[row[5]] = true
            else
              row[5] = false
            end
          end
        end
      end
    end
    row[#row + 1] = value
    row[#row + 1] = size
  end
  return row
end
local ahead = redis.call('ZCOUNT', KEYS[1], '(' .. top, '+inf')
local total = redis.call('ZCARD', KEYS[1])
local rows, spent, names, named = {}, 0, listed * most, 0  -- the bytes for names, and those read
local last = math.min(total, ahead + listed) - 1  -- the rank of the oldest listed (REV)
for rank = ahead, last do  -- the newest beat first: it gets the bytes first
  local entry = redis.call('ZRANGE', KEYS[1], rank, rank, 'REV', 'WITHSCORES')
  named = named + #entry[1]
  table.insert(rows, 1, row_of(entry[1], entry[2]))  -- listed oldest first
  if named >= names and rank < last then  -- the bytes for names spent: no name read more
    spent = 1
    break
  end
end
return {'ok', now, total, rows, ahead, spent}
