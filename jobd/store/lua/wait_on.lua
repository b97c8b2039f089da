--! uses jobs.lua workflows.lua
-- wait_on.lua: a job (the waiter) will wait for job ARGV[1] of this queue (`jobd enqueue --after`):
-- when that one has ended already (its latest history record says so), how; else the waiter is
-- registered, to be told by the script that ends it (lib/workflows.lua ended). One step: no end
-- falls between the look and the registration.
--
-- KEYS[1]   the queue's history hash
-- KEYS[2]   the queue's waiters hash
-- ARGV[1]   the job id waited for
-- ARGV[2]   the waiter, one JSON line (store/workflows.py); registered once however often sent
--
-- Returns {outcome, event} when the job ended (outcome: done, failed, cancelled), else {'waiting'}.
local records = redis.call('HGET', KEYS[1], ARGV[1])
if records then
  local ok, last = pcall(cjson.decode, string.match(records, '[^\n]*$'))
  if ok and type(last) == 'table' and ENDS[last.event] then
    return {ENDS[last.event], last.event}
  end
end
local line = ARGV[2] .. '\n'
local old = redis.call('HGET', KEYS[2], ARGV[1]) or ''
if not string.find('\n' .. old, '\n' .. line, 1, true) then
  redis.call('HSET', KEYS[2], ARGV[1], old .. line)
end
return {'waiting'}
