"""`jobd dlq`: the command-line face of ``dlq``."""

from __future__ import annotations

import argparse
import datetime
import os
import sys

import redis

from jobd import dlq, exitcodes
from jobd.cli.common import Unreachable, operator, print_json, queue_named, store_for, text
from jobd.cli.history import INTEGER
from jobd.config import Config, QueueConfig
from jobd.logs import printable, word
from jobd.store.store import Store


def run_dlq(config: Config, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """`jobd dlq QUEUE ACTION`: exit 3 when a record named is not there, 1 when one is left in
    place (requeue) or a purge is not confirmed; with --json, one JSON document on stdout."""
    queue = queue_named(config, args.queue, parser)
    if args.action == "requeue" and args.all == bool(args.refs):
        parser.error("requeue: give record or job ids, or --all")
    if args.action == "purge" and not args.yes and not confirmed(queue, parser):
        return exitcodes.FAILURE
    try:
        with store_for(config, "dlq") as store:
            if args.action == "list":
                return listing(dlq.records(store, queue, args.limit), queue, args.json)
            if args.action == "show":
                return show_one(dlq.find(store, queue, args.ref), queue, args)
            if args.action == "requeue":
                return requeue(store, queue, args)
            purged = dlq.purge(store, queue, operator())
    except Unreachable:
        return exitcodes.UNAVAILABLE
    except redis.ResponseError as exc:  # someone else's key of another type, busy, out of memory
        print(f"jobd dlq: Redis answered with an error: {printable(str(exc))}", file=sys.stderr)
        return exitcodes.FAILURE
    if args.json:
        print_json({"queue": queue.name, "stream": queue.dead_letter.stream, "purged": purged})
    else:
        print(f"purged {purged} dead letter(s) from {queue.dead_letter.stream}")
    return exitcodes.OK


def confirmed(queue: QueueConfig, parser: argparse.ArgumentParser) -> bool:
    """Whether the operator at the terminal says yes to a purge; without a terminal to ask on
    (a script, a pipe), a usage error (exit 2) that names --yes: a purge cannot be undone."""
    if not sys.stdin.isatty():
        parser.error("purge deletes every record and cannot be undone: give --yes to purge "
                     "without a terminal to confirm on")  # fmt: skip
    print(
        f"delete every dead letter of queue {queue.name} ({queue.dead_letter.stream})? [y/N] ",
        end="",
        file=sys.stderr,
        flush=True,
    )  # stderr: stdout is for what was done
    answer = sys.stdin.readline()
    if answer.strip().lower() in ("y", "yes"):
        return True
    print("jobd: not purged", file=sys.stderr)
    return False


def listing(records: list[dlq.Record], queue: QueueConfig, as_json: bool) -> int:
    if as_json:
        stream = queue.dead_letter.stream
        print_json({"queue": queue.name, "stream": stream, "records": [*map(record_json, records)]})
    else:
        try:
            for record in records:
                print(summary_line(record))
            sys.stdout.flush()
        except BrokenPipeError:  # `jobd dlq … list | head`: the reader has all it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing to flush
    return exitcodes.OK


def show_one(record: dlq.Record | None, queue: QueueConfig, args: argparse.Namespace) -> int:
    if record is None:
        print(printable(f"jobd: no dead letter {args.ref!r} in {queue.dead_letter.stream}"),
              file=sys.stderr)  # fmt: skip
        return exitcodes.NOT_FOUND
    if args.json:
        print_json(record_json(record))
    else:
        show(record)
    return exitcodes.OK


def record_json(record: dlq.Record) -> dict[str, object]:
    """A record as JSON: its id, its job id, when it failed (Unix ms, null when not a number),
    and every field as written (names and values as text: bytes not UTF-8 as ``\\xff``)."""
    failed = record.get("jobd_failed_at")
    return {
        "id": record.id,
        "job_id": text(record.fields.get(b"jobd_job_id", b"")) or None,
        "failed_at": int(failed) if INTEGER.fullmatch(failed) else None,
        "fields": {text(name): text(value) for name, value in record.fields.items()},
    }


def requeue(store: Store, queue: QueueConfig, args: argparse.Namespace) -> int:
    """`jobd dlq requeue`: 3 (nothing requeued) when a record named is not there; 1 when one is
    left in place (not a job)."""
    if args.all:
        done = dlq.requeue_existing(store, queue, operator())
    else:
        found = {ref: dlq.find_id(store, queue, ref) for ref in args.refs}
        missing = [ref for ref, record_id in found.items() if record_id is None]
        for ref in missing:
            print(printable(f"jobd: no dead letter {ref!r}"), file=sys.stderr)
        if missing:
            if args.json:
                print_json({"queue": queue.name, "requeued": [], "left": [], "missing": missing})
            return exitcodes.NOT_FOUND
        done = dlq.requeue_ids(store, queue, [i for i in found.values() if i], operator())
    if args.json:
        left = [{"id": record_id, "why": why} for record_id, why in done.left]
        print_json({"queue": queue.name, "stream": queue.stream, "requeued": done.moved,
                    "left": left, "missing": []})  # fmt: skip
    else:
        print(f"requeued {len(done.moved)} job(s) to {queue.stream}")
    for record_id, why in done.left:  # Redis-held text: escaped
        print(printable(f"jobd: left dead letter {record_id} in place: {why}"), file=sys.stderr)
    return exitcodes.FAILURE if done.left else exitcodes.OK


def when(record: dlq.Record) -> str:
    """When the record's job failed, UTC; "?" for what is no date (a record someone else
    wrote: text, digits by the thousand, a year past 9999)."""
    failed = record.get("jobd_failed_at")
    if not INTEGER.fullmatch(failed):
        return "?"
    try:
        moment = datetime.datetime.fromtimestamp(int(failed) / 1000, tz=datetime.UTC)
    except (OverflowError, ValueError, OSError):
        return "?"
    return moment.isoformat(timespec="seconds")


def summary_line(record: dlq.Record) -> str:
    code = record.get("jobd_exit_code") or "-"
    if record.get("jobd_signal"):
        code = f"signal {record.get('jobd_signal')}"
    return printable(
        f"{record.id}  job={word(record.get('jobd_job_id'))}  error={record.get('jobd_error')}  "
        f"exit={code}  attempts={record.get('jobd_attempts')}  failed={when(record)}"
    )


def show(record: dlq.Record) -> None:
    print(f"record: {record.id}")
    for name, value in record.fields.items():
        text = value.decode("utf-8", "backslashreplace")
        label = printable(name.decode("utf-8", "backslashreplace"))
        if "\n" in text.rstrip("\n"):  # stderr tails: line by line, each escaped
            print(f"{label}:")
            for line in text.rstrip("\n").split("\n"):
                print(f"  {printable(line)}")
        elif name in (b"job_id", b"jobd_job_id"):  # one word: no space or format character
            print(f"{label}: {word(text)}")
        else:
            print(f"{label}: {printable(text)}")
