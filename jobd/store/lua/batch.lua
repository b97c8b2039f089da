--! uses jobs.lua
-- batch.lua: a batch of jobs (`jobd enqueue --batch ID`), its counts in one hash, in a slot of its
-- own (jobd/store/keys.py batch): who adds to it (an *adder*: one enqueue, named by a token it
-- makes once, before its first call) opens it and seals it when done adding; each member's end
-- is counted once (its notice may be moved twice: the members set says); the batch is complete
-- once sealed with every member counted, and says so to whoever asks after that (the callback's
-- own mark makes it once: callback.lua).
--
-- Every call may be sent again with the same arguments (its reply was lost; a seal's notice
-- moved twice: store/workflows.py) and changes the batch once: the adders hash records what
-- each adder's calls did, and a call seen already changes nothing and says what the batch is.
--
-- KEYS[1]   the batch's hash: state (open, sealed, complete), open (adders at work), total,
--           done, failed, ttl, created, completed (Redis ms), incarnation, on_complete,
--           callback (JSON)
-- KEYS[2]   the ends counted: a set of the notices that told them ("OUTBOX ENTRY_ID": one a
--           member's end, written in the step that ended it), so that two jobs of one job id
--           are two members, and a notice moved twice counts once
-- KEYS[3]   the adders: a hash, token -> "SEQ COUNT" while it adds (the number of its latest
--           call applied, the jobs it counted into total), "sealed COUNT" once it sealed
-- ARGV[1]   the operation:
--   open TOKEN TTL ON_COMPLETE CALLBACK   one more adder; refused (an error) once complete
--   add TOKEN SEQ COUNT             the adder's jobs are COUNT now (its call number SEQ, 1, 2, …:
--                                   one of a number not above its latest changes nothing)
--   seal TOKEN SEQ COUNT INCARNATION  the same, and the adder is done: sealed when none is
--                                   left; INCARNATION the batch the adder opened (its open's
--                                   reply; '' from a jobd before review 35m): a seal of
--                                   another finds none ({}) and writes nothing
--   count NOTICE OUTCOME INCARNATION  a member's end, told by NOTICE (outcome done, failed or
--                                   cancelled); INCARNATION the batch its job was added to
--                                   (its jobd_batch_incarnation; '' from a jobd before review
--                                   35n): a count of another finds none ({}) and writes nothing
--   show ON_COMPLETE CALLBACK       nothing changes; each field read only up to a bound, these
--                                   two's given (shown)
-- A seal that leaves no adder at work and total 0 (every adder added nothing) deletes the
-- batch (no member's end counted in it): it is complete only with a member, and so an enqueue
-- that added nothing (its count 0) neither completes it nor calls it back, whether another
-- enqueue adds to it at the same time or not; its seal (it took its adder off) returns {}.
-- The keys expire TTL seconds (the history's max_age) after the batch's latest change; an open
-- never shortens it (the longest TTL of its opens).
--
-- A batch made where one of the same id expired is another batch: its incarnation (Redis's time
-- in µs when it was made) names its callback's mark, so the mark of the one before (which may
-- outlive it) is not its own.
--
-- Returns {state, total, done, failed, on_complete, callback, incarnation, ttl} (and, for show,
-- on_complete's length when not read: shown); {} when there
-- is no such batch (expired, never made, or someone else's key there) for count, show and a
-- seal; an error, having written nothing, when open or add find someone else's key, or an add
-- names an adder the batch does not know.
local b, members, adders, op = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
local function ours()
  local tb, tm = redis.call('TYPE', b).ok, redis.call('TYPE', members).ok
  local ta = redis.call('TYPE', adders).ok
  return (tb == 'hash' or tb == 'none') and (tm == 'set' or tm == 'none')
    and (ta == 'hash' or ta == 'none')
end
if not ours() then
  if op == 'count' or op == 'show' or op == 'seal' then return {} end
  return redis.error_reply('WRONGTYPE batch.lua: ' .. b .. ' (or its members, adders) is not a batch')
end
-- Seconds the batch's keys are kept (ttl), 1 to 10 years whatever was written there.
local function ttl_of(v)
  local s = math.floor(tonumber(v) or 1)
  if not (s >= 1) then return '1' end -- NaN too
  return string.format('%d', math.min(s, 10 * 365 * 86400))
end
-- Complete: no adder at work, at least one member (an enqueue that added nothing counts 0: a
-- batch no adder counted a job into is never complete, never called back), every one ended.
-- n: open, total, done, failed at 2..5.
local function complete(n)
  return n[2] <= 0 and n[3] > 0 and n[4] + n[5] >= n[3]
end
-- The batch as it is; marked complete (unless ``look``: show changes nothing) once it is.
local function status(look)
  local v = redis.call('HMGET', b, 'state', 'open', 'total', 'done', 'failed', 'on_complete',
    'callback', 'incarnation', 'created', 'ttl')
  local n = {} -- the numbers, 0 for one missing or that is none (someone wrote it)
  for i = 2, 5 do n[i] = math.floor(tonumber(v[i]) or 0) end
  local state = v[1] or 'open'
  if state ~= 'complete' and complete(n) then
    state = 'complete'
    if not look then
      redis.call('HSET', b, 'state', state, 'completed', string.format('%d', now_ms()))
    end
  end
  return {state, string.format('%d', n[3]), string.format('%d', n[4]),
    string.format('%d', n[5]), v[6] or '', v[7] or '', v[8] or v[9] or '',
    ttl_of(v[10])}
end
-- The batch as status(true) says it, for `jobd batch` and the dashboard (show): each field read
-- only when no longer than its bound (on_complete, a queue name: ARGV[2] bytes; the callback,
-- its keys: ARGV[3]; the others, numbers and words: 32), so that a value someone else wrote
-- there of any size never leaves Redis (a longer one is taken as missing). One value more:
-- on_complete's length when it was too long to be read (0: read).
local function shown()
  local names = {'state', 'open', 'total', 'done', 'failed', 'on_complete', 'callback',
    'incarnation', 'created', 'ttl'}
  local v, unread = {}, 0
  for i, f in ipairs(names) do
    local cap = ({on_complete = tonumber(ARGV[2]), callback = tonumber(ARGV[3])})[f] or 32
    local size = redis.call('HSTRLEN', b, f)
    if size <= cap then
      v[i] = redis.call('HGET', b, f)
    elseif f == 'on_complete' then
      unread = size
    end
  end
  local n = {}
  for i = 2, 5 do n[i] = math.floor(tonumber(v[i]) or 0) end
  local state = v[1] or 'open'
  if state ~= 'complete' and complete(n) then state = 'complete' end
  return {state, string.format('%d', n[3]), string.format('%d', n[4]),
    string.format('%d', n[5]), v[6] or '', v[7] or '', v[8] or v[9] or '', ttl_of(v[10]), unread}
end
local function keep()
  local ttl = ttl_of(redis.call('HGET', b, 'ttl'))
  redis.call('EXPIRE', b, ttl)
  for _, k in ipairs({members, adders}) do
    if redis.call('EXISTS', k) == 1 then redis.call('EXPIRE', k, ttl) end
  end
end
-- A count from the caller: an integer, 0 to 2^53 (an error before any write otherwise).
local function number(v)
  local x = tonumber(v)
  if not x or x ~= math.floor(x) or x < 0 or x > 2 ^ 53 then
    return nil, redis.error_reply('ERR batch.lua: not a count: ' .. tostring(v))
  end
  return x
end
if op == 'open' then
  local token = ARGV[2]
  if redis.call('EXISTS', b) == 1 and redis.call('HEXISTS', adders, token) == 1 then
    return status() -- this open, sent again
  end
  if redis.call('HGET', b, 'state') == 'complete' then
    return redis.error_reply('ERR batch complete: it takes no more jobs')
  end
  if redis.call('EXISTS', b) == 0 then
    local t = redis.call('TIME')
    redis.call('DEL', members, adders) -- of a batch of this id before, if they outlived its hash
    redis.call('HSET', b, 'total', 0, 'done', 0, 'failed', 0, 'open', 0,
      'created', string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)),
      'incarnation', string.format('%s%06d', t[1], tonumber(t[2])))
  end
  redis.call('HINCRBY', b, 'open', 1)
  redis.call('HSET', adders, token, '0 0')
  -- Its ttl never shortened: the longest history.max_age of the queues added to (a member of
  -- a queue of long history may still run when one of short history is added).
  local had = tonumber(ttl_of(redis.call('HGET', b, 'ttl') or 0))
  redis.call('HSET', b, 'state', 'open', 'ttl', ttl_of(math.max(had, tonumber(ARGV[3]) or 1)))
  if ARGV[4] ~= '' then
    redis.call('HSETNX', b, 'on_complete', ARGV[4])
    redis.call('HSETNX', b, 'callback', ARGV[5])
  end
  keep()
  return status()
end
if redis.call('EXISTS', b) == 0 then return {} end
-- No member's end counted (none can be: no adder counts a job; a notice of the batch before
-- this one's id still moving is counted here, and keeps it).
local function gone()
  local v = redis.call('HMGET', b, 'done', 'failed')
  return (tonumber(v[1]) or 0) == 0 and (tonumber(v[2]) or 0) == 0
    and redis.call('SCARD', members) == 0
end
-- Whether ``given``, an incarnation a call names ('' or none: not known, any), is not this
-- batch's: the batch it names is gone and another of the same id made since.
local function another(given)
  if (given or '') == '' then return false end
  local v = redis.call('HMGET', b, 'incarnation', 'created')
  return (v[1] or v[2] or '') ~= given
end
if op == 'add' or op == 'seal' then
  local token = ARGV[2]
  local seq, err = number(ARGV[3])
  if err then return err end
  local count, err2 = number(ARGV[4])
  if err2 then return err2 end
  -- The batch this adder opened is gone and one of the same id was made since (this seal's
  -- copy, its notice moved twice, after the first deleted it): not this seal's batch.
  if op == 'seal' and another(ARGV[5]) then return {} end
  local was = redis.call('HGET', adders, token)
  if not was then
    if op == 'add' then
      return redis.error_reply('ERR batch.lua: adder ' .. token .. ' never opened this batch')
    end
    -- A seal of an open never applied (it failed): nothing to take off; a late copy of that
    -- open changes nothing either.
    redis.call('HSET', adders, token, 'sealed 0')
  else
    local at, had = string.match(was, '^(%S+) (%d+)$')
    if at ~= 'sealed' and (tonumber(at) or 0) < seq then
      -- Read as numbers, written whole: nothing here fails after a write (a value someone
      -- wrote that is no integer counts as 0).
      local v = redis.call('HMGET', b, 'total', 'open', 'state')
      local total = math.floor(tonumber(v[1]) or 0) + count - (tonumber(had) or 0)
      redis.call('HSET', b, 'total', string.format('%d', total))
      redis.call('HSET', adders, token, (op == 'seal' and 'sealed' or string.format('%d', seq))
        .. ' ' .. string.format('%d', count))
      if op == 'seal' then
        local open = math.max(0, math.floor(tonumber(v[2]) or 0) - 1)
        redis.call('HSET', b, 'open', string.format('%d', open))
        if open == 0 and v[3] == 'open' then redis.call('HSET', b, 'state', 'sealed') end
        if open == 0 and total <= 0 and gone() then
          -- The last adder done, and none counted a job (each added nothing: a job held
          -- already, a --unique duplicate, one Redis refused): the batch is left as it was
          -- before them, no batch. A copy of this seal finds none ({}), as this one says.
          redis.call('DEL', b, members, adders)
          return {}
        end
      end
    end
  end
elseif op == 'count' then
  -- A member of the batch of this id before (it expired, its member outlived it: a delay, a
  -- hold, a backlog longer than history.max_age), ending after this one was made: not one of
  -- this batch's, never counted in it (review 35n: it completed it before its members ran).
  if another(ARGV[4]) then return {} end
  if redis.call('SISMEMBER', members, ARGV[2]) == 0 then
    -- Counted first: a count that is no integer (someone wrote it) fails before the notice is
    -- marked counted, and the notice stays to be moved again.
    redis.call('HINCRBY', b, ARGV[3] == 'done' and 'done' or 'failed', 1)
    redis.call('SADD', members, ARGV[2])
  end
elseif op ~= 'show' then
  return redis.error_reply('ERR batch.lua: unknown operation ' .. op)
end
if op == 'show' then return shown() end
keep()
return status()
