--! uses jobs.lua
-- lost_marks.lua: free the job ids of --unique jobs that a reclaim ended 'lost' (reclaim.lua's
-- reply: their entries were deleted while pending), each mark deleted while it says 'queued',
-- as every other end of such a job does (settle.lua, dead_letter.lua, lib/workflows.lua
-- lost_job). reclaim.lua learns a job is --unique from its taken record, after it was sent its
-- keys, so the marks come here in a call of their own; should the daemon die between the two
-- calls, a mark expires as it would have (jobd/store/keys.py UNIQUE_TTL).
--
-- KEYS[1..] the marks (jobd/store/keys.py job_mark; one queue's: one cluster slot)
--
-- A mark that says 'done' (another copy completed), is gone, or is someone else's key of
-- another type is left alone. Returns how many were deleted.
local freed = 0
for _, mark in ipairs(KEYS) do
  if says_queued(mark) then
    redis.call('DEL', mark)
    freed = freed + 1
  end
end
return freed
