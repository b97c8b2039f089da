"""The history's formats as read (docs/concepts/history.md): a job's records, an active record,
an event, and the view of a job ``jobd job`` and the dashboard show. What is read is anyone's
bytes: a line that is no JSON object is skipped, a value of the wrong type is not known."""

from __future__ import annotations

import base64
import contextlib
import re
from dataclasses import dataclass, field
from typing import Any

import orjson

_NOT_UTF8 = re.compile("[\udc80-\udcff]")  # a byte that was not UTF-8, as surrogateescape has it

_NUMBERS = {"at": "at_ms", "attempt": "attempt", "pid": "pid", "started_at": "started_ms",
            "duration_ms": "duration_ms", "exit_code": "exit_code", "signal": "signal",
            "due": "due_ms"}  # fmt: skip
_TEXTS = ("event", "entry", "stream", "consumer", "host", "error", "stdout", "stderr", "by",
          "new_entry", "owner")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Record:
    """One history record: what it does not say (or says with a value of the wrong type) is
    None, or '' for text. ``raw`` is the JSON object as written."""

    event: str = ""
    at_ms: int | None = None
    entry: str = ""
    stream: str = ""
    attempt: int | None = None
    consumer: str = ""
    host: str = ""
    pid: int | None = None
    started_ms: int | None = None
    duration_ms: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    error: str = ""
    due_ms: int | None = None
    stdout: str = ""
    stderr: str = ""
    by: str = ""
    new_entry: str = ""
    owner: str = ""
    raw: dict[str, Any] = field(default_factory=dict, compare=False)
    escaped: bool = field(default=False, compare=False)  # its line held bytes not UTF-8


@dataclass(frozen=True, slots=True)
class Running:
    """A job running now, from its active record, checked against XPENDING."""

    job_id: str
    stream: str
    entry: str
    consumer: str
    host: str = ""
    pid: int | None = None
    since_ms: int | None = None
    attempt: int | None = None
    deadline_ms: int | None = None
    progress: float | None = None  # percent, as its handler last told (renewals write it)
    status: str | None = None  # its status line as told (not UTF-8 bytes escaped: ``\\xff``)
    cancelling: bool = False  # `jobd cancel` asked it to stop: its handler is being stopped


@dataclass(frozen=True, slots=True)
class JobView:
    """A job's records, oldest first, and its state on Redis's clock ``now_ms``: 'running'
    (``running``), 'cancelling' (running, and `jobd cancel` asked it to stop: ``running``),
    'delayed' (``due_ms``), 'waiting' (the ``entry`` of ``stream`` that carries
    it when known; ``consumer`` when delivered but not running: about to start, or its daemon
    died), 'held' (waiting for others: ``held`` says for which while it is held, whatever the
    history kept; else its records), the last terminal record's event (done, dead-lettered,
    expired, poison, cancelled), or 'unknown'."""

    queue: str
    job_id: str
    state: str
    records: tuple[Record, ...]
    now_ms: int
    running: Running | None = None
    due_ms: int | None = None
    entry: str = ""
    stream: str = ""
    consumer: str = ""
    skipped: int = 0  # lines of the history that were no record (someone else's bytes)
    unread: int = 0  # bytes of its records when longer than a lookup reads: not read
    held: dict[str, Any] | None = None  # held now: {all, left, any} (``held_after``)


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of a queue's events stream: its id (its time on Redis's clock, where a reader
    resumes), the queue as configured, and its fields decoded (backslashreplace); as the
    dashboard reads one (``Store.events_feed``), of its first fields only, cut: how many it
    holds (``width``; 0: all are here) and those whose value was ``cut``, and those whose value
    is not UTF-8 (``inexact``: shown escaped, ``\\xff``, the text of another value too)."""

    id: str
    queue: str
    fields: dict[str, str]
    width: int = 0
    cut: tuple[str, ...] = ()
    inexact: tuple[str, ...] = ()


def _value(obj: dict[str, Any], name: str, number: bool) -> Any:
    value = obj.get(name)
    if number:
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:  # cjson: doubles
            return int(value)
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    return value if isinstance(value, str) else ""


def utf8(raw: bytes) -> bool:
    """Whether ``raw`` is UTF-8: shown as it is, not escaped (``\\xff``)."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def json_object(raw: bytes) -> dict[str, Any] | None:
    """``raw`` as a JSON object, or None; bytes that are not UTF-8 (Lua's cjson writes a job id
    as it is) are kept in its strings as ``\\xff``."""
    text = _NOT_UTF8.sub(_escaped, raw.decode("utf-8", "surrogateescape"))
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _escaped(match: re.Match[str]) -> str:
    return f"\\\\x{ord(match.group()) - 0xDC00:02x}"  # \\\\ in JSON: one backslash


def result_of(raw: dict[str, Any]) -> bytes | None:
    """The result a record keeps, its bytes exactly (``notes.result_field``): ``result`` as
    UTF-8, or ``result_base64`` decoded; None when it keeps none (or someone else's bytes)."""
    text, encoded = raw.get("result"), raw.get("result_base64")
    if isinstance(text, str):
        return text.encode("utf-8", "surrogateescape")
    if isinstance(encoded, str):
        with contextlib.suppress(ValueError):
            return base64.b64decode(encoded, validate=True)
    return None


def result_text(raw: dict[str, Any]) -> str | None:
    """A record's result as text to show: not UTF-8 bytes as ``\\xff``."""
    result = result_of(raw)
    return None if result is None else result.decode("utf-8", "backslashreplace")


def parse_records(blob: bytes | None) -> tuple[list[Record], int]:
    """A history value's records, and how many of its lines were none."""
    records, skipped = [], 0
    for line in (blob or b"").split(b"\n"):
        obj = json_object(line) if line.strip() else None
        if obj is None:
            skipped += bool(line.strip())
            continue
        values = {attr: _value(obj, name, True) for name, attr in _NUMBERS.items()}
        values |= {name: _value(obj, name, False) for name in _TEXTS}
        records.append(Record(**values, raw=obj, escaped=not utf8(line)))
    return records, skipped


def parse_active(job_id: str, raw: bytes) -> Running | None:
    """An active record (b"STREAM|ENTRY\\n" and a JSON object), or None when it is none."""
    head, newline, body = raw.partition(b"\n")
    obj = json_object(body) if newline else None
    if obj is None:
        return None
    stream, _, entry = head.decode("utf-8", "backslashreplace").rpartition("|")
    stream, entry = _value(obj, "stream", False) or stream, _value(obj, "entry", False) or entry
    consumer = _value(obj, "consumer", False)
    if not (stream and entry and consumer):
        return None
    number = {name: _value(obj, name, True) for name in ("pid", "since", "attempt", "deadline")}
    progress, status = obj.get("progress"), obj.get("status")
    if not isinstance(progress, int | float) or isinstance(progress, bool):
        progress = None
    return Running(job_id, stream, entry, consumer, _value(obj, "host", False), number["pid"],
                   number["since"], number["attempt"], number["deadline"], progress,
                   status if isinstance(status, str) else None)  # fmt: skip


def held_after(spec: bytes | None) -> dict[str, Any] | None:
    """What a held job waits for, from its value in the queue's after hash (lua/hold.lua: JSON
    {deps: those left, all, any, …}) as ``links`` says it (``all``, ``left``, ``any``); None
    when there is none, or it is no such JSON (someone else's bytes)."""
    try:
        obj = orjson.loads(spec) if spec else None
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    every, left = obj.get("all"), obj.get("deps")
    if not (isinstance(every, list) and isinstance(left, list)):
        return None
    return {"all": [str(x) for x in every], "left": [str(x) for x in left],
            "any": obj.get("any") is True}  # fmt: skip


def view_links(view: JobView) -> dict[str, Any]:
    """``links`` of a job's records; while it is held, ``after`` as its after hash says (its
    records may be gone: the history's bounds pass over a job held long)."""
    found = links(list(view.records))
    if view.held is not None:
        found["after"] = view.held
    return found


def links(records: list[Record]) -> dict[str, Any]:
    """A job's workflow links, from its records (docs/workflows.md), where they say: ``parent``
    (the job whose JOBD_ENQUEUE file named it, "QUEUE JOB_ID"), ``follow_ups`` (``count`` and the
    first ``jobs`` of its latest attempt that enqueued some), ``after`` (``all`` it waited for,
    those ``left``, ``any``: it runs after any outcome) and ``batch``; None for each unknown.
    With ``batch``, from the same (latest) record naming it: ``batch_incarnation``, which batch
    of that id it was a member of (None: not said; the dashboard tells an earlier batch of the
    id by it, as `jobd job` does), and ``batch_left``: it was requeued since (that record or a
    later one is its requeue: a requeued job is a member no more; the dead letter jobd writes
    names no batch, so its ``requeued`` record names one only when the dead letter did)."""
    found: dict[str, Any] = {"parent": None, "follow_ups": None, "after": None, "batch": None,
                             "batch_incarnation": None, "batch_left": False}  # fmt: skip
    for record in records:
        raw = record.raw
        if isinstance(raw.get("parent"), str):
            found["parent"] = raw["parent"]
        if isinstance(raw.get("batch"), str):
            said = raw.get("batch_incarnation")
            found.update(batch=raw["batch"], batch_left=record.event == "requeued",
                         batch_incarnation=said if isinstance(said, str) else None)  # fmt: skip
        elif record.event == "requeued" and found["batch"] is not None:
            found["batch_left"] = True
        jobs = raw.get("follow_up_jobs")
        if isinstance(count := raw.get("follow_ups"), int) and isinstance(jobs, list):
            found["follow_ups"] = {"count": count, "jobs": [j for j in jobs if isinstance(j, str)]}
        if record.event == "waiting" and isinstance(after := raw.get("after"), list):
            every = [str(x) for x in after]
            found["after"] = {"all": every, "left": list(every), "any": raw.get("any") is True}
        elif record.event in ("dependency", "dead-lettered") and found["after"] is not None:
            left = found["after"]["left"]  # a dead letter names the dependency that failed
            if raw.get("dependency") in left:
                left.remove(raw["dependency"])
        elif record.event == "released" and found["after"] is not None:
            found["after"]["left"] = []
    return found


def inexact_links(records: list[Record]) -> list[str]:
    """The jobs ``links`` names ("QUEUE JOB_ID") that may not be named exactly: those holding an
    escape (``\\x``) read from a record whose line held bytes that are not UTF-8 (escaped, so
    also the text of a job id of those characters): the page shows them as text, never as a
    link to that other job."""
    found: set[str] = set()
    for record in records:
        if not record.escaped:
            continue
        raw = record.raw
        jobs, after = raw.get("follow_up_jobs"), raw.get("after")
        named = [raw.get("parent"), *(jobs if isinstance(jobs, list) else [])]
        named += [str(x) for x in (after if isinstance(after, list) else [])]
        found.update(n for n in named if isinstance(n, str) and "\\x" in n)
    return sorted(found)
