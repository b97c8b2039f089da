"""A queue's ``on_dead_letter`` hook as dead_letter.lua takes it (lua/lib/chains.lua): the job
that carries a dead-letter record, as JSON, to another queue, written in the step that writes
the record (on a Redis Cluster into the queue's outbox, moved on as follow-ups are:
``store.outbox``).

The JSON is what ``jobd dlq show --json`` prints of the record, plus ``queue``: ``id``,
``job_id``, ``failed_at`` and ``fields`` (names and values as text, bytes not UTF-8 as
``\\xff``): built from the fields the daemon read, or, for a record that clips (a malformed
job's: they are not the record's), from its copy of the entry (record_copy.lua, the copying
code of dead_letter.lua: lua/lib/record.lua). Each value longer than ``CLIP`` keeps its first
``CLIP`` bytes, and ``clipped`` names it with its size (``"payload 67108864"``): the whole
record stays in the dead-letter stream, under ``id``. The record's id and time are Redis's,
known in the script only: the JSON is sent in four pieces, around them.

The JSON fits the hook queue's ``max_payload`` (its daemons would dead-letter a larger job
unrun, as malformed): when it would not, every value is cut to the longest length under
``CLIP`` that makes it fit (those cut named in ``clipped`` all the same). When even values cut
to nothing do not fit, no job is enqueued, and the record says why in ``jobd_on_dead_letter``
(as when the hook's queue cannot be written). lua/lib/chains.lua does the same for a held
job's record.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import orjson

from jobd.config import QueueConfig
from jobd.job import (
    BATCH,
    BATCH_INCARNATION,
    PARENT,
    PAYLOAD,
    RESERVED_JOB_ID,
    is_batch_id,
)
from jobd.newjob import HostClock, follow_up_id, follow_up_template, prepare
from jobd.outcome import Outcome

CLIP = 4096  # bytes of each value of the record the hook's JSON keeps
ROOM = 96  # bytes the record's id and its time (twice) take in the JSON at most (Redis's)
# The jobd_ fields a record copies from its job (dead_letter.lua's KEPT), each with the test its
# value passes to be copied (None: any): a batch only when it is a batch id, by the rule of every
# batch link (is_batch_id), its incarnation when no longer than jobd writes it.
KEPT: dict[bytes, Callable[[bytes], bool] | None] = {
    b"jobd_unique": None,
    b"jobd_parent": None,
    b"jobd_timeout": None,
    b"jobd_max_attempts": None,
    b"jobd_expires_at": None,
    BATCH: is_batch_id,
    BATCH_INCARNATION: lambda value: len(value) <= 32,
}


def _kept(name: bytes, value: bytes) -> bool:
    """Whether the record copies the job's field ``name``, ``value`` (dead_letter.lua)."""
    if not name.startswith(b"jobd_"):
        return True
    if name not in KEPT:
        return False
    test = KEPT[name]
    return test is None or test(value)


def hook_args(o: Outcome, jobd_fields: list[object], keys: list[str | bytes], cluster: bool,
              own: list[tuple[bytes, bytes]] | None = None) -> list[object]:  # fmt: skip
    """dead_letter.lua's ARGV for ``o``'s queue's hook (``[0]``: none); its keys appended to
    ``keys``. ``jobd_fields`` are the record's (``outcomes.record_fields``), ``own`` its copy
    of the entry (record_copy.lua), None: the fields the daemon read are it."""
    hook = o.queue.on_dead_letter
    if hook is None:
        return [0]
    pieces = json_pieces(o, jobd_fields, own)
    if isinstance(pieces, str):  # not enqueued: the record says why
        jobd_fields += ["jobd_on_dead_letter", pieces]
        return [0]
    first = len(keys) + 1
    target = hook.keys
    keys += [o.queue.keys.outbox] if cluster else [target.stream, target.delayed]
    job = o.job
    job_id = follow_up_id(job.job_id, "dead")
    entry, _ = prepare(follow_up_template(job), HostClock())
    fields = {k: v for k, v in entry.fields.items() if k != PAYLOAD}
    # Its job id as jobd's own field (as a batch's callback): no producer's job id, so the
    # hook queue's dedupe window never takes the alert of a job id dead-lettered again (sent
    # again, requeued) for the earlier one's: every dead-lettering is enqueued, and run.
    fields[RESERVED_JOB_ID] = os.fsencode(job_id)
    fields[PARENT] = f"{o.queue.name} ".encode() + os.fsencode(job.job_id)
    mark = target.follow_up(o.queue.name, job.job_id, o.message_id, "dead")
    args: list[object] = [hook.queue, target.stream, target.delayed,
                          o.queue.keys.outbox if cluster else "", mark, job_id, first,
                          *pieces]  # fmt: skip
    for name, value in fields.items():
        args += [name, value]
    return [len(args), *args]


def json_pieces(o: Outcome, jobd_fields: list[object],
                own: list[tuple[bytes, bytes]] | None = None) -> list[bytes] | str:  # fmt: skip
    """The record's JSON in four pieces: before its id, before its failed_at, before its
    jobd_failed_at (in ``fields``), and the rest; its values cut to fit the hook queue's
    max_payload, or, when they cannot be, why (``jobd_on_dead_letter``). ``own``: the record's
    copy of the entry (``hook_args``); None: the fields the daemon read, as dead_letter.lua
    copies them when it clips nothing (a job the daemon read whole: no more than MAX_FIELDS)."""
    if own is None:
        own = [(k, v) for k, v in o.job.fields.items() if _kept(k, v)]
    named = [(str(n).encode() if not isinstance(n, bytes) else n, v)
             for n, v in zip(jobd_fields[::2], jobd_fields[1::2], strict=True)]  # fmt: skip
    raws = [(name, value if isinstance(value, bytes) else str(value).encode())
            for name, value in [*own, *named]]  # fmt: skip
    values = [(name, raw, _text(raw)) for name, raw in raws]  # each converted once
    pieces = _pieces(o, values, CLIP)
    hook = o.queue.on_dead_letter
    if hook is None or hook.max_payload is None or _size(pieces) <= hook.max_payload - ROOM:
        return pieces
    most = hook.max_payload
    if (least := _size(_pieces(o, values, 0)) + ROOM) > most:
        return (f"not enqueued: queue {hook.queue}'s max_payload ({most}) is below the "
                f"record's JSON, {least} bytes with each value cut to nothing")  # fmt: skip
    # A cut that fits, one that does not (no value longer: the JSON as at CLIP): the longest
    # that fits. A value no longer than the cut is not converted again.
    low, high = 0, min(CLIP, max(len(raw) for _, raw in raws))
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if _size(_pieces(o, values, mid)) <= most - ROOM else (low, mid)
    return _pieces(o, values, low)


def _size(pieces: list[bytes]) -> int:
    return sum(len(p) for p in pieces)


def _pieces(o: Outcome, values: list[tuple[bytes, bytes, str]], clip: int) -> list[bytes]:
    """``json_pieces`` with each of ``values`` (name, value, the value as text) longer than
    ``clip`` cut to it."""
    record: dict[str, str] = {}
    clipped: list[str] = []
    for name, raw, whole in values:
        text = whole
        if len(raw) > clip:
            clipped.append(f"{_text(name)} {len(raw)}")
            text = _text(raw[:clip])
        record[_text(name)] = text
    job_id = os.fsencode(o.job.job_id)  # the record's jobd_job_id
    head = b'{"queue":' + orjson.dumps(o.queue.name) + b',"id":"'
    second = b'","job_id":' + orjson.dumps(_text(job_id) if job_id else None) + b',"failed_at":'
    third = b',"fields":' + orjson.dumps(record)[:-1] + b',"jobd_failed_at":"'
    rest = b'"}' + (b',"clipped":' + orjson.dumps(clipped) if clipped else b"") + b"}"
    return [head, second, third, rest]


# Each byte not in UTF-8 as the four characters \xNN, from the surrogate surrogateescape makes
# of it (Python's backslashreplace, which converts such bytes one at a time, three times slower).
_ESCAPES = {0xDC00 + b: f"\\x{b:02x}" for b in range(0x80, 0x100)}


def _text(raw: bytes) -> str:
    """``raw`` as text, bytes not UTF-8 as ``\\xff``: decode's backslashreplace, or, when such
    bytes are many, the same through _ESCAPES (which looks up every character)."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        text = raw.decode("utf-8", "surrogateescape")
        bad = len(raw) - len(text.encode("utf-8", "ignore"))
        if bad * 3 > len(text):
            return text.translate(_ESCAPES)
        return raw.decode("utf-8", "backslashreplace")


def held_hook(q: QueueConfig) -> dict[str, str] | None:
    """What a held job of ``q`` dead-lettered ``dependency`` (lua/lib/workflows.lua held_dead)
    needs of its queue's hook, None for none: kept in its waiter lines (``waiter_line``)."""
    hook = q.on_dead_letter
    if hook is None:
        return None
    target = hook.keys
    most = "" if hook.max_payload is None else str(hook.max_payload)
    return {"queue": hook.queue, "stream": target.stream, "delayed": target.delayed,
            "head": target.follow_up_head(q.name, "dead"), "max_payload": most}  # fmt: skip


def held_hook_args(spec: dict[str, str] | None, outbox: str, keys: list[str],
                   cluster: bool) -> list[object]:  # fmt: skip
    """unblock.lua's and expire_held.lua's ARGV for the hook ``spec`` (``held_hook``) of a
    queue whose outbox is ``outbox`` (lua/lib/chains.lua held_hook_at: ``[0]`` for none); its
    keys appended to ``keys``. Each held job's hook job id is ``follow_up_id(JOB, "dead")``."""
    if spec is None:
        return [0]
    keys += [outbox] if cluster else [spec["stream"], spec["delayed"]]
    # max_payload: the hook queue's when the waiter line was written ('': none said, a line of
    # an older jobd), which the record's JSON is cut to fit (lua/lib/chains.lua held_hook_fit)
    args = [spec["queue"], spec["stream"], spec["delayed"], outbox if cluster else "",
            spec["head"], spec.get("max_payload", "")]  # fmt: skip
    return [len(args), *args]
