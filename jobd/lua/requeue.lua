-- requeue.lua: move dead-lettered jobs back to their queue's stream, attempts reset.
--
-- KEYS[1]   the dead-letter stream
-- KEYS[2]   the queue's stream
-- ARGV[1..] ids of dead-letter records
--
-- Each record's job goes back as a new entry: its own fields plus jobd_job_id (kept, so the
-- job id stays stable) and no jobd_attempt (so attempts start again at 1); the record is
-- deleted in the same script. Returns the ids that were requeued (missing ones are skipped).
local dead, stream = KEYS[1], KEYS[2]
local done = {}
for i = 1, #ARGV do
  local rec = redis.call('XRANGE', dead, ARGV[i], ARGV[i])
  if #rec == 1 then
    local fields, job_id = rec[1][2], nil
    local entry = {stream, '*'}
    for j = 1, #fields, 2 do
      local name = fields[j]
      if name == 'jobd_job_id' then
        job_id = fields[j + 1]
      elseif string.sub(name, 1, 5) ~= 'jobd_' then
        entry[#entry + 1] = name
        entry[#entry + 1] = fields[j + 1]
      end
    end
    if job_id then
      entry[#entry + 1] = 'jobd_job_id'
      entry[#entry + 1] = job_id
    end
    redis.call('XADD', unpack(entry))
    redis.call('XDEL', dead, ARGV[i])
    done[#done + 1] = ARGV[i]
  end
end
return done
