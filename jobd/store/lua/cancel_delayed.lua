--! uses jobs.lua
-- cancel_delayed.lua: remove cancelled jobs from a delayed set, one page of it per call.
--
-- KEYS[1]   the delayed set
-- KEYS[2]   the queue's counters for this minute (a hash)
-- ARGV[1]   where the page starts (a rank in the set, from 0)
-- ARGV[2]   how many members the page holds at most
-- ARGV[3]   seconds the counters are kept
-- ARGV[4..] job ids
--
-- A member is a job of one of the ids when its jobd_job_id or job_id field is one (a member that
-- is not a job is left to promote.lua). Returns {the next page's start, or -1 at the end,
-- {job id, due (ms)}, …} for the members removed: the walk goes on where this page ended, less
-- what it removed, so a caller walks a set of any size a bounded page at a time.
local start, size = tonumber(ARGV[1]), tonumber(ARGV[2])
local wanted = {}
for i = 4, #ARGV do wanted[ARGV[i]] = true end
local page = redis.call('ZRANGE', KEYS[1], start, start + size - 1, 'WITHSCORES')
local removed = {}
for i = 1, #page, 2 do
  local job = decode_member(page[i])
  if job then
    local fields = {}
    for j = 2, #job do fields[#fields + 1] = job[j] end
    local jid = job_id_of('', fields)
    if jid ~= '' and wanted[jid] then
      redis.call('ZREM', KEYS[1], page[i])
      removed[#removed + 1] = {jid, page[i + 1]}
    end
  end
end
if #removed > 0 then
  redis.call('HINCRBY', KEYS[2], 'cancelled', #removed)
  redis.call('EXPIRE', KEYS[2], ARGV[3])
end
local after = (#page / 2 < size) and -1 or (start + size - #removed)
return {after, removed}
