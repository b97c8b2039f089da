--! uses jobs.lua record.lua
-- record_copy.lua: the copy of an entry that its dead-letter record would keep (lib/record.lua,
-- as dead_letter.lua writes it), for the on_dead_letter job's JSON of a record that clips
-- (store/chains.py json_pieces): a malformed job's, whose fields as the daemon read them are
-- not its record's (a stand-in's: lib/jobs.lua sized).
--
-- KEYS[1]  the queue's stream
-- ARGV[1]  the entry's id
-- ARGV[2]  the most bytes of each value copied (dead_letter.lua ARGV[8]): so the reply holds
--          at most MAX_FIELDS values of that many bytes, and jobd_clipped
--
-- Read-only. Returns the copy's fields (name, value, …; jobd_clipped and jobd_fields as the
-- record has them), or false when there is no such entry (deleted by hand: the record will
-- keep none of its fields).
local entry = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #entry == 0 then return false end
return record_copy({}, entry[1][2], tonumber(ARGV[2]))
