"""Review 36l of issue 36: a consumer of a long name holding the oldest pending entry blocks
Redis at every read of the queue's group (each summary, queue page, ``jobd status``, every
daemon's status report), though round 36k bounded that read "whatever anyone added to the
stream (groups and consumers, with names of any length)".

``lib/group.lua group_read`` asks ``XPENDING key group - + 1`` first, for whether the group is
there and its oldest pending id, before anything is weighed. That form answers the entry's
consumer name whole, and Redis copies it into the script: anyone who can write to Redis can
make a consumer of any name that holds the oldest entry (``XREADGROUP GROUP jobd NAME ... >``,
one command; or XCLAIM). Round 36k gated XINFO CONSUMERS on the stream's MEMORY USAGE (16 names
of 1 MiB: 0.45 s) and says of this call "one name"; but one name may be 64 MiB: 0.3 s to 0.8 s a
read here (the same order as the 16 groups of 4 MiB names 36k fixed). The consumers are rightly not
listed (MEMORY USAGE is past 1 MiB); the XPENDING before that gate is not weighed.

What should happen: one read of a queue's group holds Redis a bounded time whatever a
consumer's name (suggested fix: find the group with ``XPENDING key group - + 0``, which answers
NOGROUP or an empty list, no name; ask for the oldest pending entry (``- + 1``) only when the
stream's MEMORY USAGE, which counts the consumers' names, is within NAMES_READ, as XINFO
CONSUMERS is; else say its age is not read). Bound, as 36k's: 100 ms for one read, beyond
weighing the stream (MEMORY USAGE walks the names within Redis: its own cost, measured alone in
the same run, is the floor of any bounded read; the stop CI measured 0.12 s for the read under
load, where 40 ms is the weighing on a quiet machine). The weighing's time is read from INFO
commandstats as ``memory|usage`` (Redis 7 names subcommands so: read as ``memory``, it was 0 and
a later stop CI's 0.31 s read, all of it the weighing, failed the bound).

Fixed (lib/group.lua), then the contract changed (issue 36): a consumer's name can only be made
by a client with consumer rights on the stream (XREADGROUP, XCLAIM, XGROUP CREATECONSUMER), who
can already acknowledge or delete the queue's jobs (docs/security.md); jobd bounds what
producers can make it read, not such names. The group read asks XPENDING … - + 1 when entries
are pending (the name copied into the script, never sent back) and lists the consumers (256 at
most), each name cut to HASH_VALUE bytes: the pending count, the oldest entry and the consumer
are read, the name cut; no time is asserted. (The old weighing, MEMORY USAGE of the whole
stream, read nothing of a queue whose stream held its finished jobs:
test_review36n_retained_history_unread.py.)
"""

from __future__ import annotations

import redis

from jobd.store import status

NAME = 64 << 20  # bytes of the consumer's name


def test_the_oldest_pending_entrys_consumer_of_a_long_name_is_read_cut(r: redis.Redis) -> None:
    r.xgroup_create("q", "jobd", id="0", mkstream=True)
    oldest = r.xadd("q", {"payload": "x"})
    name = b"c" * NAME
    r.execute_command("XREADGROUP", "GROUP", "jobd", name, "COUNT", 1, "STREAMS", "q", ">")
    r.xadd("q", {"payload": "y"})  # one waiting
    group = status.hashes_shown(r, ["q"], [status.group_spec(">", "jobd")])[0]
    assert group is not None and (group.pending, group.oldest, group.lag) == (1, oldest, 1)
    assert group.listed and [c[:3] for c in group.consumers] == [
        (name[: status.HASH_VALUE], NAME, 1)
    ]
