-- drop_consumer.lua: delete a consumer from a group only if it holds no entry, atomically.
--
-- KEYS[1]  the queue's stream
-- ARGV[1]  the consumer group
-- ARGV[2]  the consumer to delete
-- ARGV[3]  delete only if its idle time is at least this many milliseconds
--
-- Returns 1 when deleted, 0 when left alone. XGROUP DELCONSUMER deletes the consumer's pending
-- entries with it, and they are never delivered again: silent job loss. So the check (nothing
-- pending) and the delete happen in one script, with no window for a delivery in between.
local stream, group, name = KEYS[1], ARGV[1], ARGV[2]
if #redis.call('XPENDING', stream, group, '-', '+', 1, name) > 0 then
  return 0
end
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', stream, group)) do
  local info = {}
  for i = 1, #c, 2 do info[c[i]] = c[i + 1] end
  if info['name'] == name then
    if tonumber(info['idle']) < tonumber(ARGV[3]) then return 0 end
    redis.call('XGROUP', 'DELCONSUMER', stream, group, name)
    return 1
  end
end
return 0
