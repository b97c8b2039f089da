--! uses jobs.lua workflows.lua
-- unwait.lua: a held job's hold ended where it waited (cancelled, dead-lettered): its
-- registration with a job it waited for (wait_on.lua) goes, so that no registration outlives its
-- hold. lib/workflows.lua unregister wrote the notice, in the step that ended the hold; a mover
-- applies it here, in the slot of the job waited for (store/workflows.py). Applied twice, or
-- after that job ended (its fields gone with its notices), it finds nothing. A registration is
-- this hold's when it names the held job and its hold's token (store/workflows.py waiter_line):
-- a later hold of the same job id, registered since, keeps its own.
--
-- KEYS[1]   the waiters hash of the job waited for's queue
-- ARGV[1]   the job id waited for; ARGV[2] the held job's id; ARGV[3] its hold's token
--
-- Cheap per notice, whatever the number of waiters (a fan-in of N holds cancelled together
-- cost N^2 JSON decodes when each notice rewrote one value holding every waiter; review 35k):
-- each waiter has fields of its own, found by its name (lib/workflows.lua add_waiter), and
-- goes with them. Waiters a jobd before that registered (one field holding them all) are moved
-- into fields of their own first, once (lib/workflows.lua upgrade_waiters).
--
-- A key of another type there (someone else's) is not read. Returns how many registrations
-- went (0 or 1).
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then return 0 end
upgrade_waiters(KEYS[1], ARGV[1])
return drop_waiter(KEYS[1], ARGV[1], ARGV[2], ARGV[3])
