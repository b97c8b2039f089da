"""The command line of workflows (docs/workflows.md): `jobd enqueue`'s --after, --after-any-outcome,
--batch and --on-complete, and `jobd batch`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jobd import exitcodes

if TYPE_CHECKING:  # `jobd --help` loads no config code (tests/test_cli_contract.py)
    from jobd.config import Config
    from jobd.store.records import JobView
    from jobd.store.store import Store

BATCH_EPILOG = """\
A batch is open while a `jobd enqueue --batch ID` adds to it, sealed when that command ends;
complete once sealed and every member has ended (done, or failed: dead-lettered, expired,
cancelled). Its callback (--on-complete) is enqueued then, once, with these counts as its
JSON payload. Exit 3 when there is no such batch (never made, or expired with the history);
exit 2 for an id no batch can have (a batch id is UTF-8, 1 to 200 characters, no space, no
control character, no '{' or '}').
"""


def add_enqueue_flags(enqueue: argparse.ArgumentParser) -> None:
    flow = enqueue.add_argument_group("workflows (docs: Workflows)")
    flow.add_argument(
        "--after", action="append", metavar="JOB_ID",
        help="hold the job until job JOB_ID of the same queue is done (QUEUE:JOB_ID: of queue "
        "QUEUE, when QUEUE is a queue of the config); may be given again: until all are done. "
        "One that is dead-lettered, expired or cancelled dead-letters this job "
        "(jobd_error=dependency). One job only (not with --lines/--ndjson)",
    )  # fmt: skip
    flow.add_argument(
        "--after-any-outcome", action="store_true",
        help="with --after: run once each has ended, however it ended",
    )  # fmt: skip
    flow.add_argument(
        "--after-timeout", metavar="DURATION",
        help="with --after: wait DURATION at most (more than 0, at most 3650d; default: the "
        "queue's max_wait, if set; else "
        "no bound); then the job is dead-lettered (jobd_error=dependency) saying what it "
        "waited for, never seen or not ended",
    )  # fmt: skip
    flow.add_argument(
        "--batch", metavar="ID",
        help="make the job (or every job of --lines/--ndjson) a member of batch ID "
        "(jobd batch ID shows it)",
    )  # fmt: skip
    flow.add_argument(
        "--on-complete", metavar="QUEUE",
        help="with --batch: once every member has ended, enqueue one job into QUEUE, the "
        "batch's counts as its JSON payload (the first enqueue of the batch to name one)",
    )  # fmt: skip


def check_enqueue_flags(
    config: Config, args: argparse.Namespace, parser: argparse.ArgumentParser
) -> None:
    from jobd.workflows import WorkflowError, check_batch_id

    if args.after and (args.lines is not None or args.ndjson is not None):
        parser.error("--after holds one job: not with --lines or --ndjson")
    if args.after_any_outcome and not args.after:
        parser.error("--after-any-outcome goes with --after")
    if args.after_timeout is not None and not args.after:
        parser.error("--after-timeout goes with --after")
    if args.on_complete is not None and args.batch is None:
        parser.error("--on-complete goes with --batch")
    if args.on_complete is not None and args.on_complete not in config.queues:
        parser.error(f"--on-complete: queue {args.on_complete!r} is not in the config")
    if args.batch is not None:
        try:
            check_batch_id(args.batch)
        except WorkflowError as exc:
            parser.error(f"--batch: {exc}")


def add_batch_command(commands: argparse._SubParsersAction, config_arg: Callable) -> None:
    batch = commands.add_parser(
        "batch", help="a batch's counts: total, done, failed, pending, state",
        epilog=BATCH_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    config_arg(batch, positional=False)
    batch.add_argument("batch_id", metavar="ID", help="the batch id (enqueue --batch ID)")
    batch.add_argument("--json", action="store_true", help="print JSON")


def run_batch(config: Config, args: argparse.Namespace) -> int:
    """`jobd batch ID`: the batch's counts; exit 3 when there is none."""
    from jobd.cli.common import print_json
    from jobd.logs import printable
    from jobd.store.store import Store
    from jobd.workflows import WorkflowError, check_batch_id

    try:  # no batch can have it (enqueue --batch refuses it): said so, not Redis's error
        check_batch_id(args.batch_id)
    except WorkflowError as exc:
        print(f"jobd batch: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    store = Store.open(config.redis, "batch")
    try:
        state = store.batch_op(args.batch_id, "show")
    finally:
        store.close()
    if state is None:
        print(f"jobd: no batch {args.batch_id!r} (never made, or expired)", file=sys.stderr)
        return exitcodes.NOT_FOUND
    counts = state.counts()
    if args.json:
        unread = state.on_complete_unread
        print_json({**counts, "on_complete": state.on_complete or None,
                    **({"on_complete_unread": unread} if unread else {})})  # fmt: skip
        return exitcodes.OK
    settled = state.done + state.failed
    # Redis's bytes (anyone who can write the batch's hash): escaped, as everything printed.
    print(printable(f"batch {state.batch_id}: {state.state}, {settled} of {state.total} "
                    f"ended: {state.done} done, {state.failed} failed, "
                    f"{state.pending} pending"))  # fmt: skip
    if state.on_complete:
        print(printable(f"on complete: a job into queue {state.on_complete}"))
    elif state.on_complete_unread:
        size = state.on_complete_unread
        print(f"on complete: {size} bytes, longer than any queue name: not read")
    return exitcodes.OK


BATCHES_CHECKED = 8  # distinct batches `jobd job` reads at most (one read each)


def batch_now(store: Store, view: JobView) -> dict[str, str | None] | None:
    """For `jobd job`: which batch of each id its records name there is now (its incarnation;
    '': none, expired), for the records that say which they were a member of
    (``batch_incarnation``, from review 35o on), latest first: one read per distinct batch id
    (a job id may be a member of several batches, one after another), BATCHES_CHECKED at most
    (the others are not in it: not checked; an id no batch can have is None, not read); None
    when no record says, nothing read."""
    from jobd.workflows import WorkflowError, check_batch_id

    named: dict[str, None] = {}  # distinct, in order
    for record in reversed(view.records):
        batch = record.raw.get("batch")
        if isinstance(batch, str) and isinstance(record.raw.get("batch_incarnation"), str):
            named[batch] = None
    if not named:
        return None
    now: dict[str, str | None] = {}
    reads = 0
    for batch in named:
        try:
            check_batch_id(batch)
        except WorkflowError:
            now[batch] = None  # no batch can have it: nothing to read
            continue
        if reads == BATCHES_CHECKED:
            break
        reads += 1
        state = store.batch_op(batch, "show")  # one script reading one hash
        now[batch] = "" if state is None else state.incarnation
    return now


def batch_where(raw: dict[str, Any], now: dict[str, str | None] | None) -> str:
    """Where `jobd job` points a record's batch (``raw["batch"]``): `jobd batch ID`, unless
    the batch of that id now is not the one it was a member of (``now``: ``batch_now``)."""
    batch, said = raw["batch"], raw.get("batch_incarnation")
    if now is None or not isinstance(said, str):
        return f"(jobd batch {batch})"
    if batch not in now:
        return f"(jobd batch {batch}: not checked, its records name over {BATCHES_CHECKED} batches)"
    if now[batch] is None or said == now[batch]:
        return f"(jobd batch {batch})"
    if not now[batch]:
        return "(its batch expired: no batch of this id now)"
    return "(an earlier batch of this id: `jobd batch` shows a later one)"
