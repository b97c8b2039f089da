"""Writing outcomes: a batch of them in one round trip, each verb one script that checks, in the
same step, that this consumer still holds the entry.

Per queue one ``settle.lua`` call for its acks and hand-backs; one ``retry.lua`` call per retry
and one ``dead_letter.lua`` call per dead letter; then per queue the cluster-wide slots to free
(``release.lua``, queues with limits) and this minute's timings (``observe.lua``). Each write is
safe to send twice: a second settle, retry or dead letter of an entry finds it no longer held
and does nothing; a hand-back sent again says how long ago it was first sent, and is left alone
when the entry was delivered since (``Outcome.sent_at``).
"""

from __future__ import annotations

import os
import secrets
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from itertools import chain

from jobd.config import QueueConfig
from jobd.outcome import MALFORMED, Outcome, Started, Verb
from jobd.store import chains, figures, notes
from jobd.store.base import StoreBase
from jobd.store.keys import STATS_TTL, UNIQUE_TTL, flatten, slot_member
from jobd.store.scripts import Batch

SETTLE_OPS = {Verb.ACK: "ack", Verb.HAND_BACK: "back", Verb.CANCEL: "cancel"}  # settle.lua's
STDERR_LIMIT = 4096  # bytes of a handler's stderr a dead-letter record keeps (its tail)
# Bytes of each value a malformed job's dead-letter record keeps (the first): a payload refused
# for its size, or a job id for its length, is not copied whole (dead_letter.lua, jobd_clipped),
# nor is such a job's when it is dead-lettered as poison first.
CLIP_BYTES = 1024

# One write's outcomes and what came of it: the (message id, owner now) pairs of the entries
# left alone because this consumer no longer holds them, or the error the call failed with.
Settled = tuple[list[Outcome], list[tuple[str, str]] | Exception]


class OutcomeOps(StoreBase):
    def settle(self, outcomes: list[Outcome]) -> list[Settled]:
        """Write ``outcomes`` (none of them RELEASE) in one round trip."""
        sent = Batch()
        calls: list[list[Outcome]] = []
        acks: dict[tuple[str, str, int], list[Outcome]] = defaultdict(list)
        parts: Counter[tuple[str, str]] = Counter()  # per queue: its settle.lua calls, less one
        loads: dict[tuple[str, str], tuple[int, int]] = {}  # follow-ups in its last call
        for o in outcomes:
            if o.verb in SETTLE_OPS:
                queue = (o.queue.stream, o.queue.group)
                if o.follow_ups:  # nearly every job has none: nothing to count
                    parts[queue] += _one_more_call(o, loads, queue)
                acks[(*queue, parts[queue])].append(o)
            elif o.verb is Verb.RETRY:
                sent.add(*self._retry(o))
                calls.append([o])
            else:
                sent.add(*self._dead_letter(o))
                calls.append([o])
        for group in acks.values():
            sent.add(*self._settle(group))
            calls.append(group)
        self._release_slots(sent, outcomes)
        self._timings(sent, outcomes)
        self._keep_retry_marks(sent, outcomes)
        replies = self.run(sent)
        # Queues whose outbox got workflow notices now (settle.lua's last pair says; a dead
        # letter may have: they are few), for the recorder to move them on at once.
        self.noticed = {
            group[0].queue.name
            for group, reply in zip(calls, replies, strict=False)
            if group[0].verb is Verb.DEAD_LETTER
            or (isinstance(reply, list) and reply[-2:] == [b"", b"notices"])
        }
        return [
            (group, reply if isinstance(reply, Exception) else _not_held(group, reply))
            for group, reply in zip(calls, replies, strict=False)  # the rest: slots, timings
        ]

    def _settle(self, outcomes: list[Outcome]) -> tuple:
        """settle.lua for one queue's acks, hand-backs and cancellations; an acked job's mark
        (its job id's) is set or cleared in the same step."""
        q = outcomes[0].queue
        stats = q.keys.stats(self.minute(q.stream))  # Redis's minute
        keys: list[str | bytes] = [q.stream, stats, q.keys.cancels, *notes.keys(q)]
        outbox = 0  # where settle.lua finds the outbox in KEYS (a cluster's); 0: none
        if self.cluster and any(o.follow_ups for o in outcomes):
            keys.append(q.keys.outbox)
            outbox = len(keys)
        ops: list[object] = []
        for o in outcomes:
            mark_index = 0  # where settle.lua finds the job's mark in KEYS; 0: none
            mark = _mark(o) if o.verb is not Verb.HAND_BACK else o.job.mark_key(q.keys, False)
            if mark is not None:  # a hand-back's: a --unique job's, deleted should it be lost
                keys.append(mark)
                mark_index = len(keys)
            again = -1 if o.sent_at is None else int((time.monotonic() - o.sent_at) * 1000)
            ops += [SETTLE_OPS[o.verb], o.message_id, mark_index, again,
                    *notes.note(o, self.consumer),
                    *follow_up_args(o, keys, outbox == 0)]  # fmt: skip
        window_ms = int((q.dedupe_window or 0) * 1000)
        args = [q.group, self.consumer, STATS_TTL, window_ms, notes.settings(q), outbox, *ops]
        return self.scripts.settle, [*keys, q.keys.waiters, q.keys.outbox, q.keys.taken], args

    def _retry(self, o: Outcome) -> tuple:
        """retry.lua: the next attempt into the delayed set, due ``delay`` from now on Redis's
        clock, and the entry acked; or, when `jobd cancel` marked it, acked as cancelled."""
        q = o.queue
        delay_ms = int(o.delay * 1000)
        fields = flatten(o.job.next_attempt_fields())
        args = [
            q.group, self.consumer, o.message_id, delay_ms, STATS_TTL, notes.settings(q),
            *notes.note(o, self.consumer), *fields,
        ]  # fmt: skip
        keys = [q.stream, q.keys.delayed, q.keys.stats(self.minute(q.stream)), *notes.keys(q),
                q.keys.cancels, q.keys.waiters, q.keys.outbox]  # fmt: skip
        mark = _mark(o)  # cleared when `jobd cancel` marked the entry: no next attempt then
        return self.scripts.retry, [*keys, mark] if mark is not None else keys, args

    def _dead_letter(self, o: Outcome) -> tuple:
        """dead_letter.lua: the record and the ack in one step (and a --unique job's
        'queued' mark cleared, and the queue's on_dead_letter job enqueued: store.chains); or,
        when `jobd cancel` marked it, acked as cancelled."""
        q = o.queue
        dead = q.dead_letter
        max_age = "" if dead.max_age is None else int(dead.max_age * 1000)
        keys: list[str | bytes] = [
            q.stream, dead.stream, q.keys.stats(self.minute(q.stream)), *notes.keys(q),
            q.keys.cancels, q.keys.waiters, q.keys.outbox, q.keys.taken,
        ]  # fmt: skip
        mark = _mark(o)  # cleared when `jobd cancel` marked the entry: cancelled, not dead
        if mark is not None:
            keys.append(mark)
        jobd_fields = record_fields(o)
        clip = CLIP_BYTES if o.error == MALFORMED or o.job.malformed else ""
        hook: list[object] = [0]
        if q.on_dead_letter is not None:
            own = self._record_copy(o, clip) if clip else None
            hook = chains.hook_args(o, jobd_fields, keys, self.cluster, own)
        args = [
            q.group, self.consumer, o.message_id, dead.maxlen, max_age, STATS_TTL,
            notes.settings(q), clip, *hook, *notes.note(o, self.consumer), *jobd_fields,
        ]  # fmt: skip
        return self.scripts.dead_letter, keys, args

    def _record_copy(self, o: Outcome, clip: int) -> list[tuple[bytes, bytes]]:
        """What ``o``'s record will keep of its entry (record_copy.lua: the fields
        dead_letter.lua copies, values clipped to ``clip``), which its on_dead_letter JSON is
        built from when the record clips: the fields the daemon read are not the record's (a
        stand-in's are none of the entry's: lua/lib/jobs.lua sized). One more call, for a
        malformed job only; none of the entry when it is gone (its record keeps none)."""
        flat = self.scripts.record_copy(keys=[o.queue.stream], args=[o.message_id, clip])
        return list(zip(flat[::2], flat[1::2], strict=True)) if flat else []

    def _keep_retry_marks(self, sent: Batch, outcomes: list[Outcome]) -> None:
        """A retried --unique job's mark lasts UNIQUE_TTL past the retry's due time, as a new
        job's does (enqueue_unique.lua): else a backoff longer than what the mark had left let
        the same job id be enqueued again while the job waits for its retry. (Sent after the
        retry: a retry not written leaves the entry pending, its mark as it was.)"""
        for o in outcomes:
            if o.verb is Verb.RETRY and (mark := o.job.mark_key(o.queue.keys, False)):
                sent.add(self.scripts.keep_marks, [mark], [UNIQUE_TTL * 1000 + int(o.delay * 1000)])

    def _timings(self, sent: Batch, outcomes: list[Outcome]) -> None:
        """This minute's histograms of enqueue-to-start and run times, per queue (figures);
        Redis's minute."""
        by_queue: dict[str, tuple[QueueConfig, Counter[str]]] = {}
        for o in outcomes:
            if o.timing is not None:
                _, counts = by_queue.setdefault(o.queue.name, (o.queue, Counter()))
                counts.update(figures.fields(*o.timing))
        for q, counts in by_queue.values():  # this minute's key: once per queue, not per job
            timings = q.keys.timings(self.minute(q.stream))
            sent.add(self.scripts.observe, [timings], [STATS_TTL, *chain(*counts.items())])

    def started(self, started: Sequence[Started]) -> None:
        """The active records of jobs running here (start.lua, one call per queue), in one
        round trip."""
        sent = Batch()
        by_queue: dict[str, list[object]] = defaultdict(list)
        now = time.monotonic()
        for s in started:
            by_queue[s.queue.keys.active] += notes.active(s, self.consumer, now)
        for active, args in by_queue.items():
            sent.add(self.scripts.start, [active], args)
        for reply in self.run(sent):
            if isinstance(reply, Exception):
                raise reply

    def _release_slots(self, sent: Batch, outcomes: list[Outcome]) -> None:
        """Free the cluster-wide slots of these entries (queues with limits.concurrency); a
        lost release expires with its lease."""
        by_queue: dict[str, list[str]] = defaultdict(list)
        for o in outcomes:
            if o.queue.slots is not None:
                member = slot_member(self.consumer, o.queue.stream, o.message_id)
                by_queue[o.queue.keys.running].append(member)
        for running, members in by_queue.items():
            sent.add(self.scripts.release, [running], members)


def _one_more_call(
    o: Outcome, loads: dict[tuple[str, str], tuple[int, int]], queue: tuple[str, str]
) -> int:
    """1 when ``o``'s follow-ups go into a settle.lua call of their own, 0 when they join the
    last call of ``queue`` (its stream and group); ``loads`` keeps what that call holds (their
    weight, their number). A call holds at most what one JOBD_ENQUEUE file may, as weighed
    by ``outcome.weight`` (the queue's max_follow_ups_bytes and max_follow_ups), unless one
    job's follow-ups alone are more (a file's and its ``then:`` steps'): its Redis time, in
    which Redis serves no other client, is one file's, not that of every parent settled with
    it (docs/workflows.md)."""
    q, jobs = o.queue, len(o.follow_ups)
    weight = sum(f.weight for f in o.follow_ups)
    held, held_jobs = loads.get(queue, (0, 0))
    over = held + weight > q.max_follow_ups_bytes or held_jobs + jobs > q.max_follow_ups
    if held_jobs and over:
        loads[queue] = (weight, jobs)
        return 1
    loads[queue] = (held + weight, held_jobs + jobs)
    return 0


def follow_up_args(o: Outcome, keys: list[str | bytes], direct: bool) -> list[object]:
    """An entry's follow-ups as settle.lua takes them (lib/jobs.lua follow_ups_at); ``direct``
    (one Redis): their streams and delayed sets added to ``keys``, where they are written."""
    args: list[object] = [len(o.follow_ups)]
    for f in o.follow_ups:
        fq = f.queue
        if direct:
            keys += [k for k in (fq.stream, fq.keys.delayed) if k not in keys]
        due = "" if f.due is None else f.due
        args += [fq.name, fq.stream, fq.keys.delayed, f.mark, due, secrets.token_hex(8), f.job_id,
                 len(f.fields), *flatten(f.fields)]  # fmt: skip
    return args


def record_fields(o: Outcome) -> list[object]:
    """The jobd_* fields of a dead-letter record (the script adds the job's own fields and
    jobd_failed_at)."""
    return [
        "jobd_job_id", os.fsencode(o.job.job_id),  # any bytes: see Job.job_id
        "jobd_queue", o.queue.name,
        "jobd_original_id", o.message_id,
        "jobd_error", o.error or "",
        "jobd_exit_code", "" if o.exit_code is None else str(o.exit_code),
        "jobd_signal", "" if o.signal is None else str(o.signal),
        "jobd_attempts", str(o.attempts),
        "jobd_stderr", o.detail[-STDERR_LIMIT:],
        *_cost(o),
    ]  # fmt: skip


def _cost(o: Outcome) -> list[object]:
    """What the failed attempt cost, when its handler ran (wait4's rusage)."""
    ran = o.ran
    cost: list[object] = []
    if ran is not None and ran.cpu_seconds is not None:
        cost += ["jobd_cpu_seconds", f"{ran.cpu_seconds:.6f}"]
    if ran is not None:  # empty: the peak is not known (docs: concepts/containment)
        cost += ["jobd_max_rss_bytes", "" if ran.max_rss_bytes is None else ran.max_rss_bytes]
    return cost


def _mark(o: Outcome) -> bytes | None:
    return o.job.mark_key(o.queue.keys, o.queue.dedupe_window is not None)


def _not_held(outcomes: list[Outcome], reply: object) -> list[tuple[str, str]]:
    """(message id, owner now) of the entries a script left alone. settle.lua returns such
    pairs for its batch; retry.lua and dead_letter.lua return {'not held', owner} for their one
    entry, and their entry's id or 1 when written."""
    if not isinstance(reply, list):
        return []
    if outcomes[0].verb in (Verb.RETRY, Verb.DEAD_LETTER):
        return [(outcomes[0].message_id, os.fsdecode(reply[1]))] if reply else []
    return [(reply[i].decode(), os.fsdecode(reply[i + 1])) for i in range(0, len(reply), 2)
            if reply[i]]  # fmt: skip  # '', 'notices': see settle
