-- settle.lua: acknowledge entries, or hand them back, but only those this consumer still holds.
--
-- KEYS[1]   the queue's stream
-- KEYS[2]   the queue's counters for this minute (a hash; see jobd/keys.py)
-- ARGV[1]   the consumer group
-- ARGV[2]   this consumer's name
-- ARGV[3]   seconds the counters are kept
-- ARGV[4..] pairs: operation, id. Operation 'ack': XACK. Operation 'back': make the entry
--           reclaimable at once (XCLAIM … TIME 1 JUSTID sets its last delivery to 1970, so it
--           looks idle for decades and any consumer's XAUTOCLAIM takes it now).
--
-- Returns a flat list of pairs for the entries left alone: id, owner now ('' when no one).
-- An entry another consumer took over is being run there: acknowledging or handing it back
-- from here would end or duplicate that run.
local stream, stats, group, me = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local skipped, done = {}, 0
for i = 4, #ARGV, 2 do
  local op, id = ARGV[i], ARGV[i + 1]
  local p = redis.call('XPENDING', stream, group, id, id, 1)
  if #p == 0 or p[1][2] ~= me then
    skipped[#skipped + 1] = id
    skipped[#skipped + 1] = (#p == 0) and '' or p[1][2]
  elseif op == 'ack' then
    done = done + redis.call('XACK', stream, group, id)
  else
    redis.call('XCLAIM', stream, group, me, '0', id, 'TIME', '1', 'JUSTID')
  end
end
if done > 0 then
  redis.call('HINCRBY', stats, 'done', done)
  redis.call('EXPIRE', stats, ARGV[3])
end
return skipped
