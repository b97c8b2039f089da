--! uses jobs.lua chains.lua workflows.lua
-- expire_held.lua: held jobs (hold.lua) whose wait has a bound (`--after-timeout`, the queue's
-- max_wait, the job's own expiry) and passed it, dead-lettered with jobd_error=dependency
-- (expired: its own expiry passed), at most ARGV[4] a call: the due ones are the first of the
-- held:until set (scored by deadline, Redis ms), so a call looks at no held job that is not
-- due. Mode 'due' (ARGV[1]) returns them, each with what it waits for still and its error, for
-- the caller to say why (store/workflows.py: never seen, or not ended); mode 'expire'
-- dead-letters those of ARGV[7..] (job id, why, error, the id of its on_dead_letter job:
-- store/chains.py held_hook_args, its job id's mark: lib/workflows.lua unmark, a key among
-- KEYS[13..]) still held and due, after the hook from ARGV[6].
--
-- KEYS[1..3] the queue's held hash, after hash and held:until set
-- KEYS[4]   the dead-letter stream
-- KEYS[5..8] the queue's history, history:at, active and events keys (lib/jobs.lua history_at)
-- KEYS[9], KEYS[10] the queue's waiters hash and outbox
-- KEYS[11]  the queue's counters of this minute
-- KEYS[12]  the queue's held:ended set (lib/workflows.lua hold_ended: each job dead-lettered
--           is kept there history.max_age, so that its enqueue sent again holds nothing)
-- KEYS[13..] the queue's on_dead_letter hook's keys, if any (lib/chains.lua held_hook_at),
--           then the marks of the job ids (expire)
-- ARGV[1]   due or expire
-- ARGV[2]   the history's settings; ARGV[3] the dead-letter stream's MAXLEN; ARGV[4] how many
--           at most (due); ARGV[5] seconds the counters are kept (expire); ARGV[6..] the
--           hook (lib/chains.lua held_hook_at: 0 for none)
--
-- Returns, due: {job id, its after JSON, its error (dependency, or expired when its own expiry
-- has passed), …} (a member no longer held is removed on the way);
-- expire: {dead-lettered, notices written into the outbox}.
local now = now_ms()
if ARGV[1] == 'due' then
  local out = {}
  for _, job in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0,
      tonumber(ARGV[4]))) do
    local spec, j = redis.call('HGET', KEYS[2], job), held_at(1, job)
    if spec and j then
      local expires = expiry_of(j)
      out[#out + 1] = job; out[#out + 1] = spec
      out[#out + 1] = (expires and expires <= now) and 'expired' or 'dependency'
    else
      redis.call('ZREM', KEYS[3], job)
    end
  end
  return out
end
local h = history_at(5, ARGV[2])
local w, dead = workflow_at(9, h.queue), 0
local hook, at = held_hook_at(6)
for i = at, #ARGV, 5 do
  local job, why, err = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local deadline = redis.call('ZSCORE', KEYS[3], job)
  local j = deadline and tonumber(deadline) <= now and held_at(1, job)
  if j then
    local extras = {'expired', err == 'expired' and 'expires-at' or 'after-timeout'}
    held_dead(j, h, w, now, why, extras, KEYS[4], ARGV[3], KEYS[11], ARGV[5], hook, ARGV[i + 3],
      ARGV[i + 4], err)
    hold_ended(KEYS[12], job, now, h.max_age)
    dead = dead + 1
  end
end
if dead > 0 then trim_history(h, now) end
return {dead, w.sent}
