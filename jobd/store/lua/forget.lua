--! uses jobs.lua
-- forget.lua: trim a queue's history by its caps (history.max_age, history.maxlen), a bounded
-- step, on Redis's clock: what the settling scripts do on each write, for a queue that has
-- stopped writing (its records still age out: stdout and stderr tails are not kept forever).
--
-- KEYS[1..4] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- ARGV[1]   the history's settings (lib/jobs.lua history_at)
--
-- Returns how many jobs' records are left.
local h = history_at(1, ARGV[1])
trim_history(h, now_ms())
if not h.records then return 0 end
return redis.call('ZCARD', h.at)
