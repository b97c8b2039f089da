"""A queue's outbox: where a job's follow-ups wait between its acknowledgement and their own
queues, on a Redis Cluster; and, on one Redis too, the notices of jobs' ends to the jobs waiting
for them and to their batches (``store.workflows``), moved on the same way (docs/workflows.md).

On one Redis, settle.lua adds a job's follow-ups to their queues in the step that acknowledges
it. On a cluster their queues are in other slots, out of that script's reach: settle.lua writes
them into the parent queue's outbox (``QueueKeys.outbox``, a stream in the parent's slot, one
entry a follow-up, its fields saying where it goes), in the same step as the ack. Daemons move
them on: the one that settled the parent at once, and every daemon of the queue now and then
(``daemon.outbox``), in case that one died. A move (follow_up.lua, in the follow-up's slot)
adds the job and sets its mark in the same step, and adds nothing when the mark is there: so
a move made twice (a mover that died between the move and the XDEL that ends it, two movers at
once, a lost reply) adds the job once. The marks live ``FOLLOW_UP_TTL``: a follow-up left in an
outbox longer than that after it was first moved (every daemon of its queue down for a week
between the two steps) could be added again.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from jobd.config import QueueConfig
from jobd.store.base import StoreBase
from jobd.store.connection import away
from jobd.store.keys import FOLLOW_UP_TTL
from jobd.store.scripts import Batch

log = logging.getLogger("jobd.outbox")

MOVE_BATCH = 100  # outbox entries one round of moves reads


class OutboxOps(StoreBase):
    def move_follow_ups(self, queue: QueueConfig, rounds: int = 10) -> int:
        """Move the follow-ups and notices waiting in ``queue``'s outbox on, at most ``rounds``
        × MOVE_BATCH of them; the number moved (added, or found there already, and taken out
        of the outbox). Each round reads the MOVE_BATCH entries after the previous round's: a
        move that fails stays in the outbox for the next call, and never holds back those
        behind it (a notice that fails at every move, someone else's write where it goes,
        would stay first for ever). A call whose rounds ran out with entries left, some of
        them failed, leaves a cursor: the next call goes on after the last entry it read, and
        starts from the outbox's first again once it reached the end. The first error is
        raised once the rounds are done; Redis away (``connection.away``) ends them at once."""
        outbox = queue.keys.outbox
        start = self._outbox_resume.pop(outbox, b"-")
        moved, error, last = 0, None, b""
        for _ in range(rounds):
            done, failed, last, full = self._move_round(queue, start)
            moved += done
            error = error or failed
            if not full or (failed is not None and away(failed)):
                break
            start = b"(" + last
        else:
            if error is not None:  # failed ones behind, more ahead: the next call goes on
                self._outbox_resume[outbox] = b"(" + last
        if error is not None:
            raise error
        return moved

    def _move_round(
        self, queue: QueueConfig, start: bytes
    ) -> tuple[int, Exception | None, bytes, bool]:
        """One read of the outbox from ``start`` (an XRANGE start) and its moves: how many
        moved, the first error, the id of the last entry read, whether the read was full
        (the outbox may hold more after it)."""
        outbox = queue.keys.outbox
        rows = self.client.xrange(outbox, min=start, count=MOVE_BATCH)
        if not rows:
            return 0, None, b"", False
        read, last = len(rows), rows[-1][0]
        notices = [row for row in rows if b"kind" in row[1]]  # dependencies, batches
        done, error = self.move_notices(outbox, notices) if notices else ([], None)  # type: ignore[attr-defined]
        rows = [row for row in rows if b"kind" not in row[1]]
        by_target: dict[tuple[bytes, bytes], list[tuple[bytes, dict[bytes, bytes]]]]
        by_target = defaultdict(list)
        for entry_id, fields in rows:
            by_target[(fields.get(b"stream", b""), fields.get(b"delayed", b""))].append(
                (entry_id, fields)
            )
        sent, groups = Batch(), []
        for (stream, delayed), entries in by_target.items():
            keys: list[object] = [stream, delayed]
            args: list[object] = [FOLLOW_UP_TTL]
            for _, f in entries:
                keys.append(f.get(b"mark", b""))
                args += [f.get(b"due", b""), f.get(b"member", b""), f.get(b"fields", b"")]
            sent.add(self.scripts.follow_up, keys, args)  # type: ignore[arg-type]
            groups.append([entry_id for entry_id, _ in entries])
        for ids, reply in zip(groups, self.run(sent), strict=True):
            if isinstance(reply, Exception):
                error = error or reply
                continue
            for n in reply[2] if len(reply) > 2 else ():  # follow_up.lua skipped it
                log.error("outbox %s entry %s is no follow-up jobd wrote (its fields unreadable)"
                          ", removed", outbox, ids[int(n) - 1])  # fmt: skip
            done += ids
        if done:
            self.client.xdel(outbox, *done)
        return len(done), error, last, read == MOVE_BATCH

    def outbox_length(self, queue: QueueConfig) -> int:
        """Follow-ups and workflow notices waiting in ``queue``'s outbox."""
        return int(self.client.xlen(queue.keys.outbox))
