--! uses jobs.lua
-- start.lua: jobs running now, in the queue's active hash (`jobd job`, the dashboard).
--
-- KEYS[1]   the queue's active hash (jobd/store/keys.py)
-- ARGV[1..] per job, five: its job id, "STREAM|ENTRY\n" (the attempt's entry), ms since it
--           started (the daemon's monotonic clock), its timeout in ms, and the rest of the
--           record (a JSON object's text, '{' first)
--
-- Each value is "STREAM|ENTRY\n" and the record with since (Redis ms: Redis's time less the
-- time it has run, so every host's records are on one clock) and deadline (since plus its
-- timeout) first. The script that settles the entry deletes it (lib/jobs.lua not_running); a
-- daemon killed -9 leaves its records behind, which readers check against the pending list, and
-- which the entry's next holder replaces. An active key of another type (someone else's) is
-- left alone. Returns how many were written.
local t = redis.call('TYPE', KEYS[1]).ok
if t ~= 'hash' and t ~= 'none' then return 0 end
local now = now_ms()
local n = 0
for i = 1, #ARGV, 5 do
  local since = now - tonumber(ARGV[i + 2])
  local deadline = since + tonumber(ARGV[i + 3])
  redis.call('HSET', KEYS[1], ARGV[i], string.format('%s{"since":%d,"deadline":%d,%s',
    ARGV[i + 1], since, deadline, string.sub(ARGV[i + 4], 2)))
  n = n + 1
end
return n
