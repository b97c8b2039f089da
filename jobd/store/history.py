"""Reading the history (docs/concepts/history.md): a job's records and where it is now (``job``: a
running job ``jobd cancel`` marked is 'cancelling' until its outcome is written), the
jobs running now (``running``), the queues' events (``events``); the settling scripts write them.
A bounded number of round trips, a pipeline per node, never a walk of a stream: a job is found by
its id in the history and active hashes, or, for an id shaped like an entry id, at that id. What
is read is anyone's bytes: a line that is no JSON object is skipped, a value of the wrong type is
not known, an active record is believed only when XPENDING agrees."""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from jobd.config import QueueConfig
from jobd.job import MAX_JOB_ID
from jobd.store import connection, status
from jobd.store.base import StoreBase
from jobd.store.browse import READ_BUDGET
from jobd.store.records import (
    Event,
    JobView,
    Record,
    Running,
    held_after,
    parse_active,
    parse_records,
)
from jobd.store.scripts import Batch

TERMINAL = frozenset({"done", "dead-lettered", "expired", "poison", "cancelled", "lost"})
DUE = frozenset({"retried", "scheduled"})  # records with a due time: delayed until then
MOVED = frozenset({"promoted", "requeued"})  # a new entry carries the job on: new_entry
HELD = frozenset({"lease lost", "reclaimed", "handed back"})  # the record's entry lives on
ENTRY_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")
POLL_MS = 100  # followed queues on a cluster: each is read with this short block in turn
MAX_BLOCK_MS = int(connection.SOCKET_TIMEOUT * 1000 / 2)  # a block never outlasts the socket
# A queue's active records read at most (lua/running_shown.lua): RUNNING_READ (their job ids
# first, then their lengths, then the values in HMGETs of RUNNING_PAGE), and a read's bytes;
# a record longer than ACTIVE_CAP is never read: none of
# jobd's (it writes well under 8 KiB: ids, host, a 1 KiB status line escaped) and not returned.
RUNNING_READ = 1000
RUNNING_PAGE = 16
ACTIVE_CAP = 16 * 1024
# A job's records read at most (``job``, lua/job_shown.lua): jobd keeps 64 KiB a job, or one
# record larger alone (a result of result_max, 1 MiB at most, kept as text or base64, and its
# output tails): longer ones are someone else's, and are not read.
RECORDS_READ = 2 << 20
# A held job's value in the after hash read at most (lua/hold.lua: workflows.MAX_AFTER names of
# a queue and a job id, twice, and each one's keys when it waits at most so long): longer is
# someone else's.
AFTER_READ = 2 << 20


@dataclass(frozen=True, slots=True)
class RunningRead:
    """A queue's jobs running now, as far as its active records were read: ``jobs`` checked
    against XPENDING, oldest first; ``records`` the hash holds (HLEN: stale ones too), ``read``
    of them; ``complete`` when all were read (``jobs`` are then every job running; else at
    most ``records`` run)."""

    jobs: list[Running]
    records: int
    read: int
    complete: bool


def _text(raw: bytes | str) -> str:
    return raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else raw


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _job_id_of(entry_id: str, row: list[Any]) -> str | None:
    """An entry's job id, as jobd.job and lib/jobs.lua's job_id_of take it, from its row of
    ``entries_shown`` (id, width, job_id, length, jobd_job_id, length); None when the one that
    names it was cut (longer than a job id: no job's)."""
    for value, length in ((row[2], row[3]), (row[4], row[5])):
        if value and b"\0" not in value:
            return os.fsdecode(value) if int(length) == len(value) else None
    return entry_id


Call = tuple[str, Callable[[Any], object]]  # a key it routes by, a command for a pipeline
# What a probe reads of an entry (lua/entries_shown.lua): its job_id and jobd_job_id, one byte
# more than a job id holds (a longer one is no job id), never its payload.
PROBED = ["job_id", MAX_JOB_ID + 1, "jobd_job_id", MAX_JOB_ID + 1]


class ScriptCall:
    """A script in a pipeline (EVALSHA), sent again through its Script, which loads it, when
    the server lacks it (after a restart or a failover: ``again``)."""

    def __init__(self, script: Script, keys: list[str], args: list[object]) -> None:
        self.script, self.keys, self.args = script, keys, args

    def __call__(self, pipe: Any) -> object:
        return pipe.evalsha(self.script.sha, len(self.keys), *self.keys, *self.args)

    def again(self, client: Any) -> object:
        try:
            return self.script(keys=self.keys, args=self.args, client=client)
        except redis.ResponseError as exc:
            return exc


class HistoryOps(StoreBase):
    def _pipelined(self, calls: list[Call]) -> list[object]:
        """``calls`` in one pipeline per node (one on a single server); replies or errors, in
        order. Commands of one call list that name keys share a slot or go to their own node."""
        nodes: dict[int, tuple[redis.Redis, list[int]]] = {}
        for i, (key, _) in enumerate(calls):
            node = connection.node_for(self.client, key)
            nodes.setdefault(id(node), (node, []))[1].append(i)
        replies: list[object] = [None] * len(calls)
        for node, indexes in nodes.values():
            pipe = node.pipeline(transaction=False)
            for i in indexes:
                calls[i][1](pipe)
            for i, reply in zip(indexes, pipe.execute(raise_on_error=False), strict=True):
                again = isinstance(reply, NoScriptError) and isinstance(calls[i][1], ScriptCall)
                replies[i] = calls[i][1].again(self.client) if again else reply  # type: ignore[attr-defined]
        return replies

    def job(self, queue: QueueConfig, job_id: str) -> JobView:
        """Job ``job_id`` of ``queue``: its records and its state now. Two round trips: the
        records, the active record, what it waits for while held (its value in the after hash:
        the history's bounds may have passed over its records), Redis's time (and, for an id
        shaped like an entry id, that entry on each level's stream); then XPENDING of the
        entries they name."""
        jid, keys = os.fsencode(job_id), queue.keys
        groups = {level.stream: level.group for level in queue.all_levels()}
        shaped = [(s, job_id) for s in groups] if ENTRY_ID.fullmatch(job_id) else []
        read = ScriptCall(self.scripts.job_shown, [keys.history, keys.active, keys.after],
                          [jid, RECORDS_READ, ACTIVE_CAP, AFTER_READ])  # fmt: skip
        first: list[Call] = [(keys.history, lambda p: p.time()), (keys.history, read)]
        replies = self._pipelined(first + self._probes(shaped, groups))
        now_ms = _now_ms(replies[0])
        shown = replies[1] if isinstance(replies[1], list) else [None, 0, None, 0, None, 0]
        blob, size, active, _, spec, _ = shown
        records, skipped = parse_records(blob)
        running = parse_active(job_id, active) if active else None
        if running is not None and running.stream not in groups:
            running = None  # not one of this queue's streams: someone else's bytes
        wanted = _wanted(records[-1], groups) if records else []
        held = self._held(running, groups) + self._marked(running, keys.cancels)
        second = self._pipelined(held + self._probes(wanted, groups))
        if running is not None and _holder(second[0], _lapse(queue)) != running.consumer:
            running = None  # stale: its daemon died (kill -9), or another holds the entry
        found = _found(job_id, shaped, groups, replies[2:])
        found = found or _found(job_id, wanted, groups, second[len(held) :])
        waits = held_after(spec) if running is None else None
        state, extra = ("held", {}) if waits else _state(records, now_ms, running, found)
        if running is not None and isinstance(second[1], float):
            state = "cancelling"  # `jobd cancel` marked it: its handler is being stopped
        return JobView(queue.name, job_id, state, tuple(records), now_ms, running,
                       skipped=skipped, unread=0 if blob else size, held=waits,
                       **extra)  # fmt: skip

    def running(self, queue: QueueConfig) -> list[Running]:
        """The jobs of ``queue`` running now, oldest first: the active records XPENDING agrees
        with (a stale one, of a daemon killed -9, is left out), each marked ``cancelling`` once
        `jobd cancel` asked it to stop; of the records one read takes (``running_read``)."""
        return self.running_read(queue).jobs

    def running_read(self, queue: QueueConfig, job_id: str = "") -> RunningRead:
        """``running``, and how many active records the queue holds and were read (``running_of``:
        with ``job_id``, that job's alone). Two round trips."""
        return self.running_of([queue], READ_BUDGET, job_id)[queue.name]

    def running_of(
        self, queues: list[QueueConfig], budget: int = READ_BUDGET, job_id: str = ""
    ) -> dict[str, RunningRead]:
        """``running`` of every queue of ``queues`` by name, in the same two round trips (a
        pipeline per node each), ``budget`` bytes shared among them: the overview's count of
        jobs running, not of entries held (``lua/running_shown.lua``); with ``job_id``, that
        job's record alone (a search: exact, whatever else runs)."""
        batch, share = Batch(), max(1, budget // max(1, len(queues)))
        for q in queues:
            args = [RUNNING_READ, share, ACTIVE_CAP, RUNNING_PAGE, *([job_id] if job_id else [])]
            batch.add(self.scripts.running_shown, [q.keys.active], args)
        candidates: list[tuple[QueueConfig, Running]] = []
        counts: dict[str, tuple[int, int, bool]] = {}
        for q, reply in zip(queues, self.run(batch), strict=True):
            groups = {level.stream: level.group for level in q.all_levels()}
            total, complete, rows = reply if isinstance(reply, list) else (0, 1, [])  # WRONGTYPE
            counts[q.name] = (int(total), len(rows), bool(complete))
            parsed = (parse_active(os.fsdecode(jid), raw) for jid, raw, _ in rows if raw)
            candidates += [(q, r) for r in parsed if r is not None and r.stream in groups]
        checks = [
            c
            for q, r in candidates
            for c in (*self._held(r, {lvl.stream: lvl.group for lvl in q.all_levels()}),
                      *self._marked(r, q.keys.cancels))
        ]  # fmt: skip
        checked = self._pipelined(checks)
        found: dict[str, list[Running]] = {q.name: [] for q in queues}
        for (q, r), pending, mark in zip(candidates, checked[::2], checked[1::2], strict=True):
            if _holder(pending, _lapse(q)) == r.consumer:
                # cancelling: `jobd cancel` marked it, its handler is being stopped
                found[q.name].append(dataclasses.replace(r, cancelling=isinstance(mark, float)))
        return {name: RunningRead(sorted(rs, key=lambda r: (r.since_ms or 0, r.job_id)),
                                  *counts[name]) for name, rs in found.items()}  # fmt: skip

    def events(
        self,
        queues: list[QueueConfig],
        after: dict[str, str] | None,
        count: int,
        block_ms: int | None = None,
    ) -> list[Event]:
        """Events of ``queues`` oldest first, merged by id (their time on Redis's clock). With
        ``after`` (queue name -> id; a queue it does not name: '0-0'): at most ``count`` after
        those ids, waiting up to ``block_ms`` for one when there is none; without: the newest
        ``count`` of them all. Someone else's key at an events name reads as no events."""
        count = max(count, 1)
        if after is None:
            calls: list[Call] = [(k, lambda p, k=k: p.xrevrange(k, "+", "-", count))
                                 for k in (q.keys.events for q in queues)]  # fmt: skip
            found = _merged(queues, [list(reversed(_list(r))) for r in self._pipelined(calls)])
            return found[-count:]
        since = {q.keys.events: after.get(q.name, "0-0") for q in queues}
        found = self._read(queues, since, count)
        if found or not block_ms:
            return found
        return self._block(queues, since, count, max(1, min(block_ms, MAX_BLOCK_MS)))

    def _read(self, queues: list[QueueConfig], since: dict[str, str], count: int) -> list[Event]:
        """One XREAD a queue, in one pipeline a node: on a cluster queues are in other slots."""
        calls: list[Call] = [(k, lambda p, k=k: p.xread({k: since[k]}, count))
                             for k in (q.keys.events for q in queues)]  # fmt: skip
        found = _merged(queues, [_read_entries(r) for r in self._pipelined(calls)])
        return found[:count]

    def _block(
        self, queues: list[QueueConfig], since: dict[str, str], count: int, block_ms: int
    ) -> list[Event]:
        """Wait up to ``block_ms`` for an event: one XREAD BLOCK over every queue, or, on a
        cluster with several queues, each queue in turn with a short block; once one comes,
        every queue is read again, so what is returned is merged in order."""
        if len(queues) == 1 or not isinstance(self.client, RedisCluster):
            try:
                reply = self.client.xread(since, count, block=block_ms)
            except redis.ResponseError:  # someone else's key at an events name: read each
                return self._read(queues, since, count)
            return self._read(queues, since, count) if _read_entries(reply) else []
        end, broken = time.monotonic() + block_ms / 1000, set()
        while time.monotonic() < end and len(broken) < len(since):
            for key in since.keys() - broken:
                node = connection.node_for(self.client, key)
                try:
                    reply = node.xread({key: since[key]}, 1, block=min(POLL_MS, block_ms))
                except redis.ResponseError:  # someone else's key: not read again this call
                    broken.add(key)
                    continue
                if _read_entries(reply):
                    return self._read(queues, since, count)
        return []

    def _held(self, r: Running | None, groups: dict[str, str]) -> list[Call]:
        """XPENDING of a running job's entry: who holds it."""
        s, e = (r.stream, r.entry) if r else ("", "")
        return [(s, lambda p: p.xpending_range(s, groups[s], e, e, 1))] if r else []

    def _marked(self, r: Running | None, marks: str) -> list[Call]:
        """Whether ``jobd cancel`` marked a running job's entry (ZSCORE of its mark)."""
        member = f"id:{r.stream}|{r.entry}".encode() if r else b""
        return [(marks, lambda p: p.zscore(marks, member))] if r else []

    def _probes(self, where: list[tuple[str, str]], groups: dict[str, str]) -> list[Call]:
        """Three commands for each (stream, entry): the entry's job id (its job_id and
        jobd_job_id fields, cut in Redis: never the entry whole), its pending record, the group
        (read in Redis, ``lib/group.lua``: only this one leaves it; an entry after the group's
        last delivered id is waiting)."""
        calls: list[Call] = []
        for s, e in where:
            g = groups[s]
            entry = ScriptCall(self.scripts.entries_shown, [s], [e, e, "fwd", 1, 1, "", 1, *PROBED])
            group = ScriptCall(self.scripts.hashes_shown, [s], status.group_args(g))  # in Redis
            calls += [(s, entry),
                      (s, lambda p, s=s, e=e, g=g: p.xpending_range(s, g, e, e, 1)),
                      (s, group)]  # fmt: skip
        return calls


def _now_ms(reply: Any) -> int:
    """TIME's reply (seconds, microseconds) in ms: Redis's clock, not this host's."""
    if isinstance(reply, Exception):
        raise reply
    return int(reply[0]) * 1000 + int(reply[1]) // 1000


def _wanted(last: Record, groups: dict[str, str]) -> list[tuple[str, str]]:
    """The entries the last record says may carry the job now: a requeue's or a promotion's
    new entry (on its stream, or any level's when it names none of them), the entry a lost,
    reclaimed or handed back lease leaves pending."""
    if last.event in MOVED and ENTRY_ID.fullmatch(last.new_entry):
        streams = [last.stream] if last.stream in groups else list(groups)
        return [(s, last.new_entry) for s in streams]
    if last.event in HELD and last.stream in groups and ENTRY_ID.fullmatch(last.entry):
        return [(last.stream, last.entry)]
    return []


def _holder(reply: object, lapse_ms: int | None = None) -> str | None:
    """Who XPENDING of one entry says holds it; None: it is not pending (or an error), or its
    lease lapsed (idle ``lapse_ms`` or more: its daemon died, a live one renews it)."""
    if not isinstance(reply, list) or not reply or not isinstance(reply[0], dict):
        return None
    if lapse_ms is not None and int(reply[0].get("time_since_delivered") or 0) >= lapse_ms:
        return None
    return _text(reply[0].get("consumer") or b"")


def _lapse(queue: QueueConfig) -> int:
    return int(queue.lease.reclaim_after * 1000)


def _found(
    job_id: str,
    where: list[tuple[str, str]],
    groups: dict[str, str],
    replies: list[object],
) -> tuple[str, str, str] | None:
    """The first of ``where`` that is job ``job_id``'s entry and live: its stream, id, and who
    it is pending on ('': undelivered); one delivered and acknowledged no longer holds the job."""
    for n, (s, e) in enumerate(where):
        shown, pending, infos = replies[3 * n : 3 * n + 3]
        entries = shown[2] if isinstance(shown, list) else []
        if len(entries) != 1:
            continue
        if _job_id_of(e, entries[0]) != job_id:
            continue  # another job's entry at that id
        if (holder := _holder(pending)) is not None:
            return s, e, holder
        group = status.group_from(infos)
        if group is None or _id_key(e) > _id_key(_text(group.last_delivered)):
            return s, e, ""
    return None


def _state(
    records: list[Record], now_ms: int, running: Running | None, found: tuple[str, ...] | None
) -> tuple[str, dict[str, Any]]:
    """The job's state, and what the view says with it; see ``JobView``."""
    last = records[-1] if records else Record()
    if running is not None:
        return "running", {}
    if last.event in DUE and last.due_ms is not None and last.due_ms > now_ms:
        return "delayed", {"due_ms": last.due_ms}
    if found is not None:
        return "waiting", dict(zip(("stream", "entry", "consumer"), found, strict=True))
    if last.event in TERMINAL:
        return last.event, {}
    if last.event in ("waiting", "dependency", "released"):  # --after (jobd.workflows)
        return "released" if last.event == "released" else "held", {}
    if last.event in DUE:  # due: in the delayed set until a daemon moves it to the stream
        return "waiting", {"due_ms": last.due_ms}
    return "unknown", {}


def _list(reply: object) -> list[Any]:
    return reply if isinstance(reply, list) else []  # an error reply: nothing


def _read_entries(reply: object) -> list[Any]:
    """The entries of an XREAD's reply (or an error: none)."""
    return [e for item in _list(reply) for e in _list(item[1])]


def _merged(queues: list[QueueConfig], entries: list[list[Any]]) -> list[Event]:
    """Each queue's entries as events, merged by id (ties: by queue name)."""
    events = [
        Event(_text(mid), q.name, {_text(k): _text(v) for k, v in fields.items()})
        for q, found in zip(queues, entries, strict=True)
        for mid, fields in found
    ]
    return sorted(events, key=lambda e: (_id_key(e.id), e.queue))
