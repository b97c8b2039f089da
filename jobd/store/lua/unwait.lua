-- unwait.lua: a held job's hold ended where it waited (cancelled, dead-lettered): its line in the
-- waiters hash of a job it waited for (wait_on.lua) goes, so that no registration outlives its
-- hold. lib/workflows.lua unregister wrote the notice, in the step that ended the hold; a mover
-- applies it here, in the slot of the job waited for (store/workflows.py). Applied twice, or
-- after that job ended (its field gone with its notices), it finds nothing. A line is this
-- hold's when it names the held job and its hold's token (store/workflows.py waiter_line): a
-- later hold of the same job id, registered since, keeps its own.
--
-- KEYS[1]   the waiters hash of the job waited for's queue
-- ARGV[1]   the job id waited for; ARGV[2] the held job's id; ARGV[3] its hold's token
--
-- Cheap per notice, whatever the number of waiters (a fan-in of N holds cancelled together cost
-- N^2 JSON decodes when each notice rewrote the value): a notice marks its hold's token gone in
-- the field JOB\0gone next to the job's (no job id holds a NUL byte): "LINES MARKED\n" then one
-- token a line, a small value; the job's own value is rewritten (its lines of marked tokens
-- dropped, by a plain match of each line's "hold":"TOKEN", decoding none but this hold's) only
-- when more than half of its LINES (as counted at its last rewrite) would be marked: each
-- rewrite is paid for by the notices before it, and marked lines are never more than the live
-- ones. lib/workflows.lua ended skips the marked lines and deletes both fields. A notice with
-- no marks field yet rewrites at once (and starts one); one whose token is no hex text (none
-- jobd writes) is looked for line by line, decoding each, as before.
--
-- A key of another type there (someone else's) is not read. Returns how many lines went (or
-- were marked to go).
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then return 0 end
local dep, token = ARGV[1], ARGV[3]
local marked = dep .. '\0gone'
local marks = redis.call('HGET', KEYS[1], marked)
if redis.call('HEXISTS', KEYS[1], dep) == 0 then
  if marks then redis.call('HDEL', KEYS[1], marked) end
  return 0
end
local hex = string.find(token, '^%x+$') ~= nil
if marks and hex then
  local cut = string.find(marks, '\n', 1, true) or #marks
  local lines, n = string.match(string.sub(marks, 1, cut), '^(%d+) (%d+)')
  lines, n = tonumber(lines) or 0, tonumber(n) or 0
  if string.find(marks, '\n' .. token .. '\n', 1, true) then return 0 end -- applied twice
  if (n + 1) * 2 <= lines then
    redis.call('HSET', KEYS[1], marked, lines .. ' ' .. (n + 1) .. '\n' ..
      string.sub(marks, cut + 1) .. token .. '\n')
    return 1
  end
end
local function mine(line)
  local ok, w = pcall(cjson.decode, line)
  return ok and type(w) == 'table' and w.job == ARGV[2] and w.hold == token
end
local gone = {}
if marks then
  for t in string.gmatch(marks, '\n(%x+)') do gone[t] = true end
end
local keep, went, count = {}, 0, 0
for line in string.gmatch(redis.call('HGET', KEYS[1], dep), '[^\n]+') do
  local t = hex and string.match(line, '"hold":"(%x+)"')
  local drop
  if t == token or not hex then drop = mine(line) else drop = t and gone[t] end
  if drop then
    if t == token or not hex then went = went + 1 end
  else
    keep[#keep + 1] = line; count = count + 1
  end
end
if count == 0 then
  redis.call('HDEL', KEYS[1], dep, marked)
  return went
end
redis.call('HSET', KEYS[1], dep, table.concat(keep, '\n') .. '\n', marked, count .. ' 0\n')
return went
