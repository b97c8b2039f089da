"""`jobd dlq`: the command-line face of ``dlq``."""

from __future__ import annotations

import argparse
import datetime
import sys

from jobd import dlq, exitcodes
from jobd.cli.common import Unreachable, operator, queue_named, store_for
from jobd.config import Config, QueueConfig
from jobd.logs import printable
from jobd.store.store import Store


def run_dlq(config: Config, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    queue = queue_named(config, args.queue, parser)
    try:
        with store_for(config, "dlq") as store:
            if args.action == "list":
                for record in dlq.records(store, queue, args.limit):
                    print(summary_line(record))
            elif args.action == "show":
                record = dlq.find(store, queue, args.ref)
                if record is None:
                    print(
                        f"jobd: no dead letter {args.ref!r} in {queue.dead_letter.stream}",
                        file=sys.stderr,
                    )
                    return exitcodes.FAILURE
                show(record)
            elif args.action == "requeue":
                if args.all == bool(args.refs):
                    parser.error("requeue: give record or job ids, or --all")
                return requeue(store, queue, args)
            elif args.action == "purge":
                purged = dlq.purge(store, queue, operator())
                print(f"purged {purged} dead letter(s) from {queue.dead_letter.stream}")
    except Unreachable:
        return exitcodes.UNAVAILABLE
    return exitcodes.OK


def requeue(store: Store, queue: QueueConfig, args: argparse.Namespace) -> int:
    """`jobd dlq requeue`: 1 when a record is not found, or is left in place (not a job)."""
    if args.all:
        done = dlq.requeue_existing(store, queue, operator())
    else:
        found = []
        for ref in args.refs:
            record = dlq.find(store, queue, ref)
            if record is None:
                print(f"jobd: no dead letter {ref!r}", file=sys.stderr)
                return exitcodes.FAILURE
            found.append(record)
        done = dlq.requeue_records(store, queue, found, operator())
    print(f"requeued {len(done.moved)} job(s) to {queue.stream}")
    for record_id, why in done.left:
        print(f"jobd: left dead letter {record_id} in place: {why}", file=sys.stderr)
    return exitcodes.FAILURE if done.left else exitcodes.OK


def when(record: dlq.Record) -> str:
    try:
        ms = int(record.get("jobd_failed_at"))
    except ValueError:
        return "?"
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="seconds")


def summary_line(record: dlq.Record) -> str:
    code = record.get("jobd_exit_code") or "-"
    if record.get("jobd_signal"):
        code = f"signal {record.get('jobd_signal')}"
    return printable(
        f"{record.id}  job={record.get('jobd_job_id')}  error={record.get('jobd_error')}  "
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
        else:
            print(f"{label}: {printable(text)}")
