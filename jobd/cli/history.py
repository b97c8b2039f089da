"""`jobd job` (a job's attempts and its state now) and `jobd events` (a queue's events, or a
follow of them): the command-line face of ``store.history``. Everything printed of Redis's bytes
goes through ``printable``; ``--json`` output is one JSON document (``job``) or one object a line
with its stream id (``events``), so a reader resumes by id."""

from __future__ import annotations

import argparse
import datetime
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Collection
from typing import Any

import orjson

from jobd import exitcodes
from jobd.cli.common import Unreachable, queue_named, store_for
from jobd.cli.workflow import batch_now, batch_where
from jobd.config import Config, QueueConfig
from jobd.logs import printable, safe_json, word
from jobd.store import connection
from jobd.store.history import ENTRY_ID
from jobd.store.records import Event, JobView, Record, Running, result_text, view_links
from jobd.store.store import Store

FOLLOW_BLOCK_MS = 1000  # a follow's read waits this long for an event, then asks about a signal
FOLLOW_COUNT = 1000  # events a follow's read takes at most
NUMBERS = ("attempt", "exit_code", "signal", "duration_ms", "due", "count")  # ints in --json
MAX_ID_PART = 2**64 - 1  # the largest part of a stream id Redis takes
INTEGER = re.compile(r"-?[0-9]{1,18}")  # what JSON readers take as an exact integer
NOW = "now"  # --after now: after each queue's newest event when the command starts
SHOWN = ("time", "queue", "event", "job", "by", "consumer")  # an event line's columns, not details


def when(ms: int | None) -> str:
    """Redis ms as UTC ISO 8601, to the millisecond; '?' when not known."""
    if ms is None:
        return "?"
    try:
        moment = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    except (OverflowError, ValueError, OSError):  # someone else's number: no date
        return f"{ms}ms"
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _seconds(ms: int) -> str:
    return f"{ms / 1000:.3f}s"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _text(value: str | bytes) -> str:
    """A job id as JSON can carry it: bytes that are not UTF-8 as ``\\xff``."""
    raw = value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")
    return raw.decode("utf-8", "backslashreplace")


# -- jobd job ------------------------------------------------------------------------------------


def run_job(config: Config, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """`jobd job`: exit 3 (NOT_FOUND) when the job's state is unknown."""
    queue = queue_named(config, args.queue, parser)
    try:
        with store_for(config, "job") as store:
            view = store.job(queue, args.job_id)
            now = None if args.json else batch_now(store, view)  # an earlier batch of its id?
    except Unreachable:
        return exitcodes.UNAVAILABLE
    try:
        if args.json:
            body = orjson.dumps(job_json(view), option=orjson.OPT_INDENT_2)
            sys.stdout.buffer.write(safe_json(body))
            sys.stdout.buffer.write(b"\n")
        else:
            print("\n".join(job_lines(view, now)))
        sys.stdout.flush()
    except BrokenPipeError:  # `jobd job … | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush
    return exitcodes.NOT_FOUND if view.state == "unknown" else exitcodes.OK


def job_json(view: JobView) -> dict[str, Any]:
    running = view.running
    return {
        "queue": view.queue,
        "job": _text(view.job_id),
        "state": view.state,
        "now": view.now_ms,
        "running": None if running is None else running_json(running),
        "due": view.due_ms,
        "entry": view.entry or None,
        "stream": view.stream or None,
        "consumer": view.consumer or None,
        "records": [r.raw for r in view.records],
        "skipped": view.skipped,
        "unread": view.unread,
        "result": done_result(view),
        **view_links(view),  # parent, follow_ups, after (while held: what it waits for), batch
    }


def done_result(view: JobView) -> str | None:
    """The result of the job's last done attempt, as text (bytes that are not UTF-8 as
    ``\\xff``; its record keeps them exactly: docs/concepts/history.md); None: none kept."""
    done = [r for r in view.records if r.event == "done"]
    return result_text(done[-1].raw) if done else None


def running_json(r: Running) -> dict[str, Any]:
    return {"job": _text(r.job_id), "stream": r.stream, "entry": r.entry,
            "consumer": r.consumer, "host": r.host, "pid": r.pid, "since": r.since_ms,
            "attempt": r.attempt, "deadline": r.deadline_ms, "progress": r.progress,
            "status": r.status}  # fmt: skip


def job_lines(view: JobView, now: dict[str, str | None] | None = None) -> list[str]:
    """The human view: the state line, then each record with its output tails, indented."""
    lines = [printable(f"job {word(view.job_id)} of queue {view.queue}: {state_text(view)}")]
    for record in view.records:
        lines.append(printable(record_line(record)))
        for name in ("stdout", "stderr", "detail", "result"):  # detail: why it never ran
            tail = result_text(record.raw) if name == "result" else record.raw.get(name)
            if tail and isinstance(tail, str):
                lines.append(f"  {name}:")
                lines += [f"    {printable(line)}" for line in tail.rstrip("\n").split("\n")]
        lines += links_lines(record.raw, now)
    if view.skipped:
        lines.append(f"({view.skipped} line(s) of its history were no record: skipped)")
    if view.unread:
        lines.append(f"(its history is {view.unread} bytes, more than jobd writes a job: not read)")
    if view.state == "unknown" and not view.records:
        lines.append(
            "no record of it: a job that has not run yet is found only by its entry id "
            "(a job id given by its producer is known once an attempt ends)"
        )
    return lines


def links_lines(raw: dict[str, Any], now: dict[str, str | None] | None = None) -> list[str]:
    """A record's workflow links (docs/workflows.md): its batch (``now``: workflow.batch_now),
    the job that enqueued it, the jobs it enqueued."""
    lines = []
    if isinstance(batch := raw.get("batch"), str):
        lines.append(printable(f"  batch: {batch} {batch_where(raw, now)}"))
    if isinstance(parent := raw.get("parent"), str):
        lines.append(printable(f"  parent: {parent}"))
    named = raw.get("follow_up_jobs")
    if isinstance(count := raw.get("follow_ups"), int) and isinstance(named, list):
        lines.append(f"  follow-ups: {count}")
        lines += [printable(f"    {name}") for name in named if isinstance(name, str)]
        if count > len(named):
            lines.append(f"    … and {count - len(named)} more")
    return lines


def state_text(view: JobView) -> str:
    r = view.running
    if r is not None:
        stopping = view.state == "cancelling"
        doing = "cancelling (jobd cancel): stopping its handler, " if stopping else ""
        return (f"{doing}running on {r.consumer} (host {r.host or '?'}, pid {r.pid or '?'}) since "
                f"{when(r.since_ms)}, attempt {r.attempt or '?'}, deadline "
                f"{when(r.deadline_ms)}, entry {r.entry} of {r.stream}{told_text(r)}")  # fmt: skip
    if view.state in ("held", "released"):
        return held_text(view)
    if view.state == "delayed":
        left = _seconds((view.due_ms or 0) - view.now_ms)
        return f"delayed: due {when(view.due_ms)} (in {left})"
    if view.state == "waiting" and view.consumer:
        return (f"waiting: entry {view.entry} of {view.stream} delivered to {view.consumer}, "
                "not running (about to start, or taken over once its lease lapses)")  # fmt: skip
    if view.state == "waiting" and view.entry:
        return f"waiting: entry {view.entry} of {view.stream}, not delivered yet"
    if view.state == "waiting":
        return f"waiting: due since {when(view.due_ms)}, moved to the stream by a daemon"
    return view.state


def held_text(view: JobView) -> str:
    """A job --after others (docs/workflows.md): what it waits for still, as its after hash
    says while it is held (the history's bounds may have passed over its records), else as
    its records say."""
    if view.state == "released":
        return "released: every job it waited for has ended; in its stream, to run"
    if view.held is not None:
        left, every = view.held["left"], view.held["all"]
        return f"held: waiting for {len(left)} of {len(every)}: {', '.join(left)}"
    # The latest hold's: a job id held, cancelled where it waits and held anew keeps the
    # records of both holds (oldest first); each `waiting` record starts a hold over.
    named: list[str] = []
    total = 0
    for record in view.records:
        if record.event == "waiting":
            # Records are Redis's bytes: an `after` that is no list (someone else's write)
            # names none.
            after = record.raw.get("after")
            named = [str(x) for x in after] if isinstance(after, list) else []
            total = len(named)
        elif record.event == "dependency" and record.raw.get("dependency") in named:
            named.remove(record.raw["dependency"])
    return f"held: waiting for {len(named)} of {total}: {', '.join(named)}"


def told_text(r: Running) -> str:
    """What its handler last told of itself (progress, status), as the running line ends."""
    told = f", {r.progress:g}% done" if r.progress is not None else ""
    return told + (f", status: {r.status}" if r.status is not None else "")


def record_line(r: Record) -> str:
    """One record: when, what, where it ran, how it ended, why."""
    parts = [when(r.started_ms if r.started_ms is not None else r.at_ms), r.event or "?"]
    if r.attempt is not None:
        parts.append(f"attempt {r.attempt}")
    if r.consumer:
        parts.append(f"on {r.consumer} (host {r.host or '?'}, pid {r.pid or '?'})")
    if r.signal is not None:
        parts.append(f"killed by {_signal_name(r.signal)}")
    elif r.exit_code is not None:
        parts.append(f"exit {r.exit_code}")
    if r.duration_ms is not None:
        parts.append(f"after {_seconds(r.duration_ms)}")
    if r.error:
        parts.append(f"error: {r.error}")
    extras = (("due", when(r.due_ms) if r.due_ms is not None else ""), ("by", r.by),
              ("new entry", r.new_entry), ("now held by", r.owner))  # fmt: skip
    parts += [f"{name} {value}" for name, value in extras if value]
    return "  ".join(parts)


# -- jobd events ---------------------------------------------------------------------------------


def run_events(config: Config, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """`jobd events`: the newest ``--count`` events (or those after ``--after``), then, with
    ``--follow``, every new one until SIGINT or SIGTERM (exit 0)."""
    names = args.queues or list(config.queues)
    queues = [queue_named(config, name, parser) for name in dict.fromkeys(names)]
    if args.count < 1:
        parser.error("--count: at least 1")
    after = starts(queues, args.after or [], parser, config.queues) if args.after else None
    try:
        with store_for(config, "events") as store:
            after = from_now(store, queues, after)
            shown = store.events(queues, after, args.count)
            emit(shown, args.json, positions(queues, after, shown))
            if not args.follow:
                return exitcodes.OK
            return follow(store, queues, resume(queues, after, shown), args.json)
    except Unreachable:
        return exitcodes.UNAVAILABLE
    except KeyboardInterrupt:  # before a follow began: as the follow would
        return exitcodes.OK
    except BrokenPipeError:  # `jobd events | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush
        return exitcodes.OK


def starts(
    queues: list[QueueConfig],
    given: list[str],
    parser: argparse.ArgumentParser,
    known: Collection[str] = (),
) -> dict[str, str]:
    """``--after ID`` (every queue not named otherwise) and ``--after QUEUE=ID``, as queue name
    -> id; an id given as MS is MS-0. A QUEUE=ID of a queue not read is left out, so a cursor
    a --json event printed resumes whatever queues are asked for now (one not in the config,
    ``known``, any more: said on stderr). Each part of an id must be at most 2**64-1, the
    largest Redis takes: a larger one was taken, and showed nothing, or failed every read
    of a follow."""
    read = {q.name for q in queues}
    after: dict[str, str] = {}
    for value in (part for values in given for part in values.split(",")):
        name, _, raw = value.rpartition("=")
        entry = raw if "-" in raw or raw == NOW else f"{raw}-0"
        if entry != NOW and not ENTRY_ID.fullmatch(entry):
            parser.error(
                f"--after {value}: an event id (MS-SEQ or MS), or QUEUE=ID of a queue read"
            )
        if entry != NOW and any(int(part) > MAX_ID_PART for part in entry.split("-")):
            parser.error(f"--after {value}: each part of an event id is at most {MAX_ID_PART}")
        if name and name not in read:
            if name not in known:
                print(f"jobd: --after {value}: no queue {name!r} in the config; left out",
                      file=sys.stderr)  # fmt: skip
            continue
        after |= {name: entry} if name else {q.name: entry for q in queues if q.name not in after}
    return after


def from_now(
    store: Store, queues: list[QueueConfig], after: dict[str, str] | None
) -> dict[str, str] | None:
    """``after`` with each ``now`` made the id of the queue's newest event (0-0: none yet), so
    what is read is what comes after this moment."""
    if after is None or NOW not in after.values():
        return after
    newest = {q.name: store.events([q], None, 1) for q in queues if after.get(q.name) == NOW}
    return after | {name: found[-1].id if found else "0-0" for name, found in newest.items()}


def resume(
    queues: list[QueueConfig], after: dict[str, str] | None, shown: list[Event]
) -> dict[str, str]:
    """Where a follow goes on, per queue: after the last event shown of it; a queue with none
    shown, after where it started, or after the oldest event shown (its own were older and
    left out), or from its start."""
    return positions(queues, after, shown) | {e.queue: e.id for e in shown}


def positions(
    queues: list[QueueConfig], after: dict[str, str] | None, shown: list[Event]
) -> dict[str, str]:
    """Where each queue's events were read from, before ``shown``: from ``after``, or (the
    newest shown) after the oldest event shown."""
    start = dict(after or {})
    oldest = shown[0].id if shown and after is None else "0-0"
    return {q.name: start.get(q.name, oldest) for q in queues}


def follow(store: Store, queues: list[QueueConfig], after: dict[str, str], as_json: bool) -> int:
    """Print every new event until SIGINT or SIGTERM; when Redis goes away, say so once, keep
    asking, and go on from the last event shown of each queue when it is back."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    away = connection.Outage(_StderrLog(), "jobd: ")  # type: ignore[arg-type]
    while not stop.is_set():
        asked = time.monotonic()
        try:
            found = store.events(queues, after, FOLLOW_COUNT, FOLLOW_BLOCK_MS)
        except connection.UNAVAILABLE as exc:
            stop.wait(away.down(exc, "retrying; the follow goes on from the last event shown"))
            store.refresh()
            continue
        away.up()
        emit(found, as_json, dict(after))
        after |= {e.queue: e.id for e in found}
        if not found and time.monotonic() - asked < FOLLOW_BLOCK_MS / 2000:
            stop.wait(0.2)  # a read that could not block (someone else's key): no busy loop
    return exitcodes.OK


class _StderrLog:
    """What ``connection.Outage`` logs to, for a command: one line on stderr."""

    def warning(self, message: str, *args: object) -> None:
        print(message % args, file=sys.stderr, flush=True)

    info = warning


def emit(events: list[Event], as_json: bool, at: dict[str, str]) -> None:
    """Print ``events``; as JSON, each with ``after``: every queue's position once it is
    handled (``at``: each queue's before the first), the --after that resumes right after it.
    One id cannot: two queues' streams number their events each on its own, so an event of
    one can come after an event of another in the same millisecond with a smaller id."""
    for e in events:
        if as_json:
            at[e.queue] = e.id
            cursor = ",".join(f"{name}={mid}" for name, mid in at.items())
            line = orjson.dumps(event_json(e) | {"after": cursor})
            sys.stdout.buffer.write(safe_json(line) + b"\n")
        else:
            sys.stdout.write(event_line(e) + "\n")
    sys.stdout.flush()


def event_json(e: Event) -> dict[str, Any]:
    """An event as one JSON object: its fields (the numeric ones as numbers), ``id`` (where a
    reader resumes: --after ID), ``queue`` as configured and ``at`` (Redis ms, from the id)."""
    body: dict[str, Any] = dict(e.fields)
    for name in NUMBERS:
        if INTEGER.fullmatch(body.get(name, "")):
            body[name] = int(body[name])
    return body | {"id": e.id, "queue": e.queue, "at": int(e.id.partition("-")[0])}


def event_line(e: Event) -> str:
    """time, queue, event, job, who (the daemon, or the operator), then the other fields."""
    f = e.fields
    who = f.get("consumer") or f.get("by") or "-"
    details = [f"{k}={when(int(v)) if k == 'due' and INTEGER.fullmatch(v) else v}"
               for k, v in f.items() if k not in SHOWN]  # fmt: skip
    job = word(f.get("job", "-"))
    head = [when(int(e.id.partition("-")[0])), e.queue, f.get("event", "?"), job, who]
    return printable("  ".join(head + details))
