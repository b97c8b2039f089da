--! uses jobs.lua
-- callback.lua: a complete batch's callback job (`--on-complete QUEUE`) into its queue, once: its
-- mark (jobd/store/keys.py callback_mark, in the queue's slot) is set in the same step, and a
-- callback whose mark is there is not added again (two movers of the batch's last members at
-- once, a mover that died after this step and before the outbox's XDEL).
--
-- KEYS[1]   the queue's stream     KEYS[2] the callback's mark
-- KEYS[3..6] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- ARGV[1]   seconds the mark is kept; ARGV[2] the history's settings; ARGV[3] the batch id
-- ARGV[4..] the job's fields, name, value pairs
--
-- Returns 1 when added, 0 when its mark was there.
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local args = {KEYS[1], '*'}
for i = 4, #ARGV do args[#args + 1] = ARGV[i] end
local entry = redis.call('XADD', unpack(args))
redis.call('SET', KEYS[2], entry, 'EX', ARGV[1])
emit(history_at(3, ARGV[2]), 'batch complete', {'batch', ARGV[3], 'entry', entry})
return 1
