--! uses jobs.lua
-- callback.lua: a complete batch's callback job (`--on-complete QUEUE`) into its queue, once: its
-- mark (jobd/store/keys.py callback_mark, in the queue's slot) is set in the same step, and a
-- callback whose mark is there is not added again (two movers of the batch's last members at
-- once, a mover that died after this step and before the outbox's XDEL, a reply lost and the
-- call sent again). The mark is named after the batch's incarnation (batch.lua): a batch made
-- again under the same id, after the one before expired, has a mark of its own.
--
-- KEYS[1]   the queue's stream     KEYS[2] the callback's mark
-- KEYS[3..6] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- ARGV[1]   seconds the mark is kept: at least the batch's own keys' (the caller's look at the
--           batch kept those that long), and kept that long again by each call that finds it,
--           so the mark outlives the batch it guards
-- ARGV[2]   the history's settings; ARGV[3] the batch id
-- ARGV[4..] the job's fields, name, value pairs
--
-- Returns 1 when added, 0 when its mark was there.
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('EXPIRE', KEYS[2], ARGV[1])
  return 0
end
local args = {KEYS[1], '*'}
for i = 4, #ARGV do args[#args + 1] = ARGV[i] end
local entry = redis.call('XADD', unpack(args))
redis.call('SET', KEYS[2], entry, 'EX', ARGV[1])
emit(history_at(3, ARGV[2]), 'batch complete', {'batch', ARGV[3], 'entry', entry})
return 1
