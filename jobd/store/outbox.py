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

Each entry is looked at on its own before it joins a call (``follow_up_misfit``,
``call_misfit``): one that is no follow-up or notice jobd wrote (someone else's XADD: a mark in
another cluster slot than its stream, a value redis-py cannot send) would make the whole call
fail, for every entry grouped with it, at every move. It is logged and removed instead.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from itertools import islice

import orjson
from redis.crc import key_slot

from jobd.config import QueueConfig
from jobd.outcome import FIELD_BYTES
from jobd.store.base import StoreBase
from jobd.store.connection import away
from jobd.store.keys import FOLLOW_UP_TTL
from jobd.store.scripts import Batch, unsendable

log = logging.getLogger("jobd.outbox")

MOVE_BATCH = 100  # outbox entries one round of moves reads
DUE = re.compile(rb"[+-]?[0-9]{1,18}")  # a due time as jobd writes one: Unix ms, or +MS
WAITER_TEXTS = ("base", "stream", "dead", "job")  # a waiter line's values that name keys: text
SHOWN = 200  # bytes of each name and value of an entry a log line quotes (repr: escaped)
Entry = tuple[bytes, dict[bytes, bytes]]  # an outbox entry: its id, its fields


def call_misfit(keys: list, args: list, cluster: bool) -> str | None:
    """Why a script call of ``keys`` and ``args`` is none jobd makes, so must not be sent:
    a value redis-py cannot encode (a JSON list, object, true or null in someone else's
    notice: it refuses the whole pipeline), or on a cluster keys in more than one slot
    (Redis refuses the call, CROSSSLOT, with every entry grouped in it); None for a call
    that can be sent."""
    if (why := unsendable(keys) or unsendable(args)) is not None or not cluster:
        return why
    slots = {key_slot(k if isinstance(k, (bytes, memoryview)) else str(k).encode()) for k in keys}
    return "its keys in more than one cluster slot" if len(slots) > 1 else None


def follow_up_misfit(f: dict[bytes, bytes], cluster: bool) -> str | None:
    """Why outbox entry ``f`` is no follow-up jobd wrote (settle.lua, lib/chains.lua): a key
    missing or empty, a mark in another slot than its stream (jobd derives each mark in its
    target's slot: ``QueueKeys.follow_up``), a due time neither '' nor Unix ms nor +MS; None
    for one follow_up.lua can take (it skips those whose fields it cannot read)."""
    keys = [f.get(b"stream", b""), f.get(b"delayed", b""), f.get(b"mark", b"")]
    if not all(keys):
        return "its stream, delayed set or mark missing"
    due = f.get(b"due", b"")
    if due and not DUE.fullmatch(due):
        return "its due time no number"
    return call_misfit(keys, [], cluster)


def packed_weight(packed: bytes) -> int:
    """What a follow-up packed by settle.lua (a cmsgpack array of names and values) weighs, as
    ``outcome.weight`` counts it or a little more: its bytes, and FIELD_BYTES a field (the
    array's header says how many values it holds, not how long each is: no unpacking)."""
    head = packed[:1]
    if head and 0x90 <= head[0] <= 0x9F:  # fixarray: up to 15 values
        values = head[0] - 0x90
    elif head in (b"\xdc", b"\xdd"):  # array 16, array 32: the count follows, big-endian
        values = int.from_bytes(packed[1 : 3 if head == b"\xdc" else 5], "big")
    else:  # no array (follow_up.lua skips it): its bytes
        values = 0
    return len(packed) + FIELD_BYTES * (values // 2)


def cut(entries: list[Entry], budget: int, most: int) -> list[list[Entry]]:
    """One target's follow-up ``entries`` in follow_up.lua calls of at most ``budget`` weight
    (``packed_weight``) and ``most`` entries each, an entry alone when its own weight is more:
    what one call adds is bounded as a settle.lua call's is (``store.outcomes``), whatever
    the move gathered (the follow-ups of every parent settled since the last one)."""
    calls: list[list[Entry]] = []
    call: list[Entry] = []
    held = 0
    for entry in entries:
        weight = packed_weight(entry[1].get(b"fields", b""))
        if call and (held + weight > budget or len(call) >= most):
            calls.append(call)
            call, held = [], 0
        call.append(entry)
        held += weight
    if call:
        calls.append(call)
    return calls


def waiter_of(line: bytes) -> dict:
    """A release notice's waiter line (``workflows.waiter_line``), read; TypeError for one jobd
    never wrote: no JSON object, its base, stream, dead-letter stream or job no text (its keys
    are derived from them), its dead-letter MAXLEN no integer (``call_misfit`` sees the rest)."""
    w = orjson.loads(line)
    texts = isinstance(w, dict) and all(isinstance(w.get(n), str) for n in WAITER_TEXTS)
    if not texts or type(w.get("maxlen")) is not int or w["maxlen"] < 0:
        raise TypeError("no waiter line jobd wrote")
    return w


def thrown_out(what: str, outbox: str, entry_id: bytes, why: str, f: dict[bytes, bytes]) -> None:
    """Say that entry ``entry_id`` of ``outbox`` (fields ``f``) is no ``what`` jobd wrote, and
    is removed: ``why``, and its first 20 names and values, each cut to SHOWN bytes (repr:
    none of someone else's bytes reaches the log unescaped)."""
    quoted = {k[:SHOWN]: v[:SHOWN] for k, v in islice(f.items(), 20)}
    log.error("outbox %s entry %s is no %s jobd wrote (%s), removed: %r",
              outbox, entry_id, what, why, quoted)  # fmt: skip


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
        by_target: dict[tuple[bytes, bytes], list[Entry]] = defaultdict(list)
        for entry_id, fields in rows:
            if (why := follow_up_misfit(fields, self.cluster)) is not None:
                thrown_out("follow-up", outbox, entry_id, why, fields)
                done.append(entry_id)
                continue
            by_target[(fields.get(b"stream", b""), fields.get(b"delayed", b""))].append(
                (entry_id, fields)
            )
        sent, groups = Batch(), []
        for (stream, delayed), entries in by_target.items():
            for call in cut(entries, queue.max_follow_ups_bytes, queue.max_follow_ups):
                keys: list[object] = [stream, delayed]
                args: list[object] = [FOLLOW_UP_TTL]
                for _, f in call:
                    keys.append(f.get(b"mark", b""))
                    args += [f.get(b"due", b""), f.get(b"member", b""), f.get(b"fields", b"")]
                sent.add(self.scripts.follow_up, keys, args)  # type: ignore[arg-type]
                groups.append(call)
        for entries, reply in zip(groups, self.run(sent), strict=True):
            if isinstance(reply, Exception):
                error = error or reply
                continue
            for n in reply[2] if len(reply) > 2 else ():  # follow_up.lua skipped it
                entry_id, fields = entries[int(n) - 1]
                thrown_out(
                    "follow-up", outbox, entry_id, "its fields unreadable or too many", fields
                )
            done += [entry_id for entry_id, _ in entries]
        if done:
            self.client.xdel(outbox, *done)
        return len(done), error, last, read == MOVE_BATCH

    def outbox_length(self, queue: QueueConfig) -> int:
        """Follow-ups and workflow notices waiting in ``queue``'s outbox."""
        return int(self.client.xlen(queue.keys.outbox))
