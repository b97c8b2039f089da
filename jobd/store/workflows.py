"""Dependencies (``enqueue --after``) and batches (``enqueue --batch``) on Redis
(docs/workflows.md): each step one script, in the slot of the keys it changes.

A job that waits for others is *held* in its queue (``hold``, its queue's slot) and registered
with each job it waits for (``wait_on``, that job's queue's slot: answered at once when that one
ended already). The script that ends a job (settle.lua, dead_letter.lua, unblock.lua) writes a
notice into its queue's outbox for each job waiting for it and for its batch, in the same step
(lua/lib/workflows.lua); daemons move the notices on, as they move follow-ups
(``store.outbox``): ``unblock`` in the waiter's slot, ``batch_op('count')`` in the batch's.
Each is safe to apply twice (a dependency told again is 'seen', a notice counted again is in
the batch's members set), so a mover that dies before the notice's XDEL, or two at once, change
nothing twice. A batch complete once gets its callback once: its mark (``callback``).

An enqueue seals its batch the same way: a *seal* notice (``seal_notice``) in the outbox of the
queue it added to, applied at once by the enqueue (``apply_seal``) and else by the daemons. The
seal may complete the batch, and the callback is the move's next step: whoever dies or loses
Redis between the two, the notice stays until both are done (the seal names its enqueue's
token, so applying it again changes nothing: lua/batch.lua).

On one Redis as on a cluster the same way: a job's waiters are not known to the daemon that
ends it before its script reads them, and a script must name every key it touches.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import orjson
import redis

from jobd.config import QueueConfig, durations
from jobd.job import RESERVED_JOB_ID
from jobd.newjob import follow_up_id
from jobd.store import chains, notes
from jobd.store.base import StoreBase
from jobd.store.keys import (
    FOLLOW_UP_TTL,
    STATS_TTL,
    UNIQUE_TTL,
    QueueKeys,
    batch,
    batch_adders,
    batch_members,
)
from jobd.store.outbox import call_misfit, thrown_out, waiter_of
from jobd.store.scripts import Batch

log = logging.getLogger("jobd.outbox")

Row = tuple[bytes, dict[bytes, bytes]]
# Bytes of a batch's on_complete (a queue name) and of its callback (``callback_spec``: the
# queue's keys and name) a show reads at most: a longer one, written by someone else, is not
# read (``BatchState.on_complete_unread``; a callback: ''), never sent whole.
ON_COMPLETE_READ = 4096
CALLBACK_READ = 16384
EXPIRE_PAGE = 100  # held jobs past their deadline one expire_held.lua pass looks at


@dataclass(frozen=True)
class BatchState:
    """A batch as batch.lua reports it."""

    batch_id: str
    state: str  # open, sealed, complete
    total: int
    done: int
    failed: int
    on_complete: str  # '' for no callback
    callback: str  # JSON: where the callback goes (``callback_spec``)
    incarnation: str = ""  # which batch of this id (batch.lua): names its callback's mark
    ttl: int = 1  # seconds its keys are kept after its latest change
    on_complete_unread: int = 0  # a show's on_complete longer than ON_COMPLETE_READ: its bytes

    @property
    def pending(self) -> int:
        return max(0, self.total - self.done - self.failed)

    def counts(self) -> dict[str, object]:
        return {"batch": self.batch_id, "state": self.state, "total": self.total,
                "done": self.done, "failed": self.failed, "pending": self.pending}  # fmt: skip


def waiter_line(q: QueueConfig, job_id: str, token: str = "") -> bytes:
    """How a held job of ``q`` (a queue, or a level of it: its stream) is named to the jobs it
    waits for: what a mover needs to reach it (``unblock``), and which hold of its job id
    (``token``, its delayed member id, random per hold: a notice written for an earlier hold
    of the job id finds this one 'gone'; '' for any hold, as lines written before it was)."""
    return orjson.dumps({
        "queue": q.name, "job": job_id, "hold": token, "stream": q.stream, "base": q.keys.base,
        "dead": q.dead_letter.stream, "maxlen": q.dead_letter.maxlen,
        "settings": notes.settings(q), "hook": chains.held_hook(q),
    })  # fmt: skip


def held_token(packed: bytes) -> bytes | None:
    """The second item of a held value (cmsgpack's array of strings, hold.lua: due, delayed
    member id, fields), its hold's token; None for a value that is not such an array."""
    at, kind = 1, packed[:1]
    if kind in (b"\xdc", b"\xdd"):  # array 16, 32
        at = 3 if kind == b"\xdc" else 5
    elif not kind or not 0x90 <= kind[0] <= 0x9F:
        return None
    for item in range(2):
        head = packed[at] if at < len(packed) else -1
        if 0xA0 <= head <= 0xBF:
            size, at = head & 0x1F, at + 1
        elif head in (0xD9, 0xDA, 0xDB, 0xC4, 0xC5, 0xC6):
            n = {0xD9: 1, 0xC4: 1, 0xDA: 2, 0xC5: 2, 0xDB: 4, 0xC6: 4}[head]
            size, at = int.from_bytes(packed[at + 1 : at + 1 + n], "big"), at + 1 + n
        else:
            return None
        if item == 1:
            return packed[at : at + size]
        at += size
    return None


def callback_spec(q: QueueConfig) -> bytes:
    """Where a batch's callback goes: its --on-complete queue's keys (the batch keeps it)."""
    return orjson.dumps({"stream": q.stream, "base": q.keys.base, "settings": notes.settings(q)})


def _history(base: str, dead: str | None = None) -> tuple[QueueKeys, list[str]]:
    k = QueueKeys.of(base, dead)
    return k, [k.history, k.history_at, k.active, k.events]


class WorkflowOps(StoreBase):
    def hold(self, q: QueueConfig, job_id: str, after: bytes, due: object, member: str,
             record: bytes, fields: dict[bytes, bytes],
             unique: bool = False) -> int | str:  # fmt: skip
        """``hold_token``'s answer, without the token."""
        return self.hold_token(q, job_id, after, due, member, record, fields, unique)[0]

    def hold_token(self, q: QueueConfig, job_id: str, after: bytes, due: object, member: str,
                   record: bytes, fields: dict[bytes, bytes],
                   unique: bool = False) -> tuple[int | str, str]:  # fmt: skip
        """Hold job ``job_id`` of ``q`` until what ``after`` names (JSON) is done: 1 when held
        now; 0 when it is held already, -1 when its hold ended (released, dead-lettered) within
        the queue's history.max_age (an enqueue sent again: nothing written). A ``unique`` job
        takes its job id's mark in the same step; when the id is there already, nothing is
        held and its mark ('queued', 'done') is returned. With it, the hold's token (its
        delayed member id: ``member`` when held now, the hold's own when held already)."""
        keys = [q.keys.held, q.keys.after, *notes.keys(q), q.keys.held_until, q.keys.held_ended]
        if unique:
            keys.append(q.keys.job_mark(job_id))
        flat = [x for item in fields.items() for x in item]
        args = [job_id, after, notes.settings(q), "" if due is None else due, member, record,
                UNIQUE_TTL * 1000 if unique else "", *flat]  # fmt: skip
        reply = self.scripts.hold(keys=keys, args=args)
        if isinstance(reply, list):  # held already: that hold's token
            return int(reply[0]), reply[1].decode()
        return (reply.decode() if isinstance(reply, bytes) else int(reply)), member

    def wait_on(self, dep: QueueConfig, job_id: str, waiter: bytes) -> tuple[str, str] | None:
        """Register ``waiter`` (a ``waiter_line``: once by its job and hold) with job ``job_id``
        of ``dep``; or, when it ended already and does not run again now, (outcome, event)."""
        k, w = dep.keys, orjson.loads(waiter)
        keys = [k.history, k.waiters, k.active, k.job_mark(job_id), k.taken,
                *(level.stream for level in dep.all_levels())]  # fmt: skip
        args = [job_id, waiter, dep.group, w["job"], w.get("hold", "")]
        reply = self.scripts.wait_on(keys=keys, args=args)
        return None if reply[0] == b"waiting" else (reply[0].decode(), reply[1].decode())

    def know(self, queues: Iterable[QueueConfig]) -> None:
        """The max_payload of each of ``queues`` (a config's, in force now), and their hooks'."""
        for q in queues:
            self.know_hook(q)
            self.payload_limits[q.name] = str(q.max_payload)  # a hook queue's own, first of all

    def know_hook(self, q: QueueConfig) -> None:
        """Take ``q``'s on_dead_letter queue's max_payload as in force: a held job's record is
        cut to fit it (``unblock_call``), not its waiter line's copy, of its hold's day."""
        if (hook := q.on_dead_letter) is not None:
            limit = hook.max_payload
            self.payload_limits[hook.queue] = "" if limit is None else str(limit)

    def after_of(self, q: QueueConfig, job_id: str) -> dict | None:
        """The after hash's spec of held job ``job_id`` of ``q`` (hold.lua), None when it is
        not held (or its spec is not JSON jobd wrote)."""
        try:
            spec = orjson.loads(self.client.hget(q.keys.after, job_id) or b"null")
        except (orjson.JSONDecodeError, redis.ResponseError):  # someone else's, not a spec
            return None
        return spec if isinstance(spec, dict) else None

    def holds(self, q: QueueConfig, job_id: str, token: str) -> bool:
        """Whether job ``job_id`` of ``q`` is held by the hold of token ``token`` now (its
        delayed member id, the second item of its held value: hold.lua)."""
        try:
            packed = self.client.hget(q.keys.held, job_id)
        except redis.ResponseError:  # WRONGTYPE: someone else's, no hold
            return False
        return packed is not None and held_token(packed) == token.encode()

    def unwait(self, dep: QueueConfig, dep_job: str, job_id: str, token: str) -> int:
        """Take the registration of hold ``token`` of ``job_id`` off job ``dep_job`` of
        ``dep`` (unwait.lua, as the notice of its end does); how many went (0 or 1)."""
        keys = [dep.keys.waiters]
        return int(self.scripts.unwait(keys=keys, args=[dep_job, job_id, token]))

    def _notice_call(self, outbox: str, entry_id: bytes, f: dict[bytes, bytes]) -> tuple:
        """The script call that applies notice ``entry_id`` of ``outbox`` (its fields ``f``);
        KeyError, TypeError, ValueError for an entry that is no notice."""
        outcome, event = f.get(b"outcome", b"").decode(), f.get(b"event", b"").decode()
        if f.get(b"kind") == b"release":
            waiter = waiter_of(f.get(b"waiter", b"{}"))  # TypeError: no line jobd wrote
            return self.unblock_call(waiter, f[b"dep"].decode(), outcome, event)
        if f.get(b"kind") == b"unwait":  # a hold ended: its registration goes (unwait.lua)
            return self.scripts.unwait, [f[b"waiters"].decode()], [f[b"dep"], f[b"job"], f[b"hold"]]
        b_id = f[b"batch"].decode()
        keys = _batch_keys(b_id)
        if f.get(b"kind") == b"seal":  # an enqueue done adding (``seal_notice``)
            seal = [int(f[b"seq"]), int(f[b"count"]), f.get(b"incarnation", b"")]
            return self.scripts.batch, keys, ["seal", f[b"token"], *seal]
        # Counted once by the notice, written once by the step that ended the member (two jobs of
        # one job id are two members, this notice moved again counts nothing more), in the batch
        notice = outbox.encode() + b" " + entry_id  # of its incarnation only (none: a jobd before)
        return self.scripts.batch, keys, ["count", notice, outcome, f.get(b"incarnation", b"")]

    def unblock_call(self, waiter: dict, dep: str, outcome: str, event: str) -> tuple:
        """unblock.lua's call: ``dep`` ended (``outcome``, ``event``), and ``waiter`` (a
        ``waiter_line``'s JSON) waits for it."""
        k, history = _history(waiter["base"], waiter["dead"])
        stream = waiter["stream"]
        at = k.at(stream)  # the queue's keys, or its level's: the job mark is the queue's
        keys = [k.held, k.after, k.held_until, stream, at.delayed, waiter["dead"], *history,
                k.waiters, k.outbox, k.stats(self.minute(k.base)),
                at.job_mark(waiter["job"]), k.held_ended]  # fmt: skip
        hook = waiter.get("hook")
        if isinstance(hook, dict) and hook.get("queue") in self.payload_limits:  # in force now
            hook = {**hook, "max_payload": self.payload_limits[hook["queue"]]}
        hook = chains.held_hook_args(hook, k.outbox, keys, self.cluster)
        args = [waiter["job"], dep, outcome, event, waiter["settings"], waiter["maxlen"],
                STATS_TTL, follow_up_id(waiter["job"], "dead"), waiter.get("hold", ""),
                *hook]  # fmt: skip
        return self.scripts.unblock, keys, args

    def cancel_held(self, q: QueueConfig, job_ids: list[str], by: str) -> tuple[list[str], int]:
        """Cancel those of ``job_ids`` held in ``q`` (cancel_held.lua): the ones cancelled, and
        the notices their ends wrote into the outbox (to move on). The 'job:' marks jobd cancel
        set for them on each level go with them."""
        k = q.keys
        levels = [level.keys.cancels for level in q.all_levels()]
        keys = [k.held, k.after, k.held_until, *notes.keys(q), k.waiters, k.outbox,
                k.stats(self.minute(k.base)), *levels, *map(k.job_mark, job_ids)]  # fmt: skip
        args = [notes.settings(q), by, STATS_TTL, len(levels), *job_ids]
        done, sent = self.scripts.cancel_held(keys=keys, args=args)
        return [j.decode() for j in done], int(sent)

    def expire_held(self, q: QueueConfig) -> tuple[int, int]:
        """Dead-letter the held jobs of ``q`` past their deadline (expire_held.lua), EXPIRE_PAGE
        at most, each saying what it still waited for: a job never seen (no history record in
        its queue) or not ended. The number dead-lettered, and the notices written (outbox)."""
        k = q.keys
        keys = [k.held, k.after, k.held_until, q.dead_letter.stream, *notes.keys(q), k.waiters,
                k.outbox, k.stats(self.minute(k.base)), k.held_ended]  # fmt: skip
        hook = chains.held_hook_args(chains.held_hook(q), k.outbox, keys, self.cluster)
        base = [notes.settings(q), q.dead_letter.maxlen]
        due = self.scripts.expire_held(keys=keys, args=["due", *base, EXPIRE_PAGE])
        if not due:
            return 0, 0
        each: list[object] = []
        for job, spec, error in zip(due[::3], due[1::3], due[2::3], strict=True):
            mark = k.job_mark(job)
            keys.append(mark)
            why = expired_why(orjson.loads(spec), self._seen, error == b"expired")
            each += [job, why, error, follow_up_id(os.fsdecode(job), "dead"), mark]
        args = ["expire", *base, EXPIRE_PAGE, STATS_TTL, *hook, *each]
        dead, sent = self.scripts.expire_held(keys=keys, args=args)
        return int(dead), int(sent)

    def _seen(self, where: list[str], job_id: str) -> bool:
        """Whether a record of ``job_id`` is in one of the hashes ``where``; a key of another
        type there (someone else's) holds none, as wait_on.lua reads it."""
        for key in where:
            try:
                if self.client.hexists(key, job_id):
                    return True
            except redis.ResponseError:  # WRONGTYPE: not jobd's, so no record of the job
                continue
        return False

    def batch_op(self, batch_id: str, op: str, *args: object) -> BatchState | None:
        """batch.lua's ``op`` on batch ``batch_id``; its state after (None: no such batch). A
        ``show`` reads each field only up to a bound (``ON_COMPLETE_READ``, ``CALLBACK_READ``)."""
        if op == "show":
            args = (ON_COMPLETE_READ, CALLBACK_READ)
        return _state(batch_id, self.scripts.batch(keys=_batch_keys(batch_id), args=[op, *args]))

    def seal_notice(self, outbox: str, fields: dict[bytes, bytes]) -> bytes:
        """Write an enqueue's seal of its batch (``fields``: kind seal, batch, token, seq,
        count, incarnation) into ``outbox``, its queue's; its entry id. Written twice (a lost
        reply, sent again), it seals once."""
        return self.client.xadd(outbox, fields)  # type: ignore[return-value]

    def apply_seal(self, outbox: str, entry_id: bytes, f: dict[bytes, bytes]) -> BatchState | None:
        """Apply seal notice ``entry_id`` of ``outbox`` (``seal_notice``) now, as a move does:
        the seal, the callback when the seal completed the batch, the notice deleted after
        both; the batch's state (None: there is no such batch)."""
        script, keys, args = self._notice_call(outbox, entry_id, f)
        state = _state(f[b"batch"].decode(), script(keys=keys, args=args))
        self._complete(state)
        self.client.xdel(outbox, entry_id)
        return state

    def _complete(self, state: BatchState | None) -> None:
        """The callback of a batch found complete (once: ``callback``'s mark)."""
        if state is not None and state.state == "complete" and state.callback:
            self.callback(state)

    def callback(self, state: BatchState) -> bool:
        """Batch ``state``'s callback job into its --on-complete queue, once (its mark);
        whether this call added it."""
        spec = orjson.loads(state.callback)
        k, history = _history(spec["base"])
        keys = [spec["stream"], k.callback_mark(state.batch_id, state.incarnation), *history]
        # Its job id as jobd's own field (as a retry's): no producer's job id, so the callback
        # queue's dedupe window never takes it for the callback of the same id's batch before
        # (an incarnation calls back once: its mark, not the window, says so).
        fields = [b"payload", orjson.dumps(state.counts()), RESERVED_JOB_ID,
                  f"batch:{state.batch_id}"]  # fmt: skip
        args = [max(FOLLOW_UP_TTL, state.ttl), spec["settings"], state.batch_id, *fields]
        return bool(self.scripts.callback(keys=keys, args=args))

    def move_notices(self, outbox: str, rows: list[Row]) -> tuple[list[bytes], Exception | None]:
        """Apply the workflow notices ``rows`` of ``outbox`` (release, batch); the ids of those
        applied (to delete) and the first error (the others stay for the next move)."""
        sent, ids, garbage = Batch(), [], []
        for entry_id, f in rows:
            try:  # a call redis-py cannot send, or Redis refuses whole, is never sent
                call = self._notice_call(outbox, entry_id, f)
                why = call_misfit(call[1], call[2], self.cluster)
            except (KeyError, TypeError, ValueError, orjson.JSONDecodeError) as exc:
                why = type(exc).__name__
            if why is None:
                sent.add(*call)
                ids.append((entry_id, f))
                continue
            # Not a notice jobd wrote (someone else's XADD, a value mangled): said and removed,
            # so that it never holds back the notices beside and behind it.
            thrown_out("notice", outbox, entry_id, why, f)
            garbage.append(entry_id)
        done, error = garbage, None
        for (entry_id, f), reply in zip(ids, self.run(sent), strict=True):
            try:
                if isinstance(reply, Exception):
                    raise reply
                if f.get(b"kind") in (b"batch", b"seal"):
                    self._complete(_state(f[b"batch"].decode(), reply))
                done.append(entry_id)
            except Exception as exc:  # left in the outbox: moved again later
                error = error or exc
        return done, error


def expired_why(after: dict, seen: Callable[[list[str], str], bool], expiry: bool = False) -> str:
    """Why a held job that waited its whole bound (``expiry``: its own expiry passed) is
    dead-lettered: what it still waits for, each "never seen" (no record of it in its queue's
    history, nor running: ``seen(keys, job id)``, the keys ``after["seen"]`` names) or "not
    ended" (neither said when the hold has no such keys: it had no bound but its expiry)."""
    where = after.get("seen")
    told = []
    for dep in after["deps"]:
        if where is None:
            told.append(dep)
            continue
        known = dep in where and seen(where[dep], dep.split(" ", 1)[-1])
        told.append(f"{dep}, {'not ended' if known else 'never seen'}")
    if expiry:
        return f"expired unrun while held (jobd_expires_at passed), waiting for {'; '.join(told)}"
    waited = durations.format(after.get("timeout_ms", 0) / 1000)
    return f"waited {waited} for {'; '.join(told)}"


def _batch_keys(batch_id: str) -> list[str]:
    return [batch(batch_id), batch_members(batch_id), batch_adders(batch_id)]


def _state(batch_id: str, reply: object) -> BatchState | None:
    """batch.lua's reply as a BatchState; None for no batch, and for a hash jobd never wrote
    (anyone who can write the batch's key: bytes not UTF-8, counts not numbers): said, and
    taken as no batch of jobd's, so that neither `jobd batch` nor a daemon moving a notice of
    it fails on it again and again."""
    if not isinstance(reply, list) or len(reply) not in (8, 9):
        return None
    try:
        state, total, done, failed, on_complete, callback, incarnation, ttl, *unread = (
            v.decode() if isinstance(v, bytes) else str(v) for v in reply
        )
        return BatchState(batch_id, state, int(total), int(done), int(failed), on_complete,
                          callback, incarnation, int(ttl),
                          int(unread[0]) if unread else 0)  # fmt: skip
    except ValueError:  # UnicodeDecodeError too
        log.warning("batch %r: its hash holds what jobd never wrote: taken as no batch", batch_id)
        return None
