"""The command line's grammar: each command of ``jobd`` and the arguments it takes
(``build_parser``); what the commands do is in ``main``."""

from __future__ import annotations

import argparse
import os

from jobd import __version__
from jobd.config import DEFAULT_CONFIG


def _config_arg(parser: argparse.ArgumentParser, positional: bool) -> None:
    parser.add_argument(
        "-c",
        "--config",
        dest="config_opt",
        metavar="PATH",
        help=f"config file (default: $JOBD_CONFIG, else {DEFAULT_CONFIG})",
    )
    if positional:
        parser.add_argument("config_pos", nargs="?", metavar="CONFIG", help="config file")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jobd", description="A job worker on Redis Streams: one subprocess per job."
    )
    parser.add_argument("--version", action="version", version=f"jobd {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    validate = commands.add_parser("validate", help="check a config file and exit")
    _config_arg(validate, positional=True)
    validate.add_argument("--format", choices=("text", "json"), default="text")

    run = commands.add_parser("run", help="run the daemon in the foreground")
    _config_arg(run, positional=True)
    run.add_argument(
        "--log-level",
        default=os.environ.get("JOBD_LOG_LEVEL", "INFO"),
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
    )
    run.add_argument(
        "--log-format", default=os.environ.get("JOBD_LOG_FORMAT", "text"), choices=("text", "json")
    )
    # Internal: one of the daemons a supervisor runs (`processes:` over 1), and which one.
    run.add_argument("--process", type=int, metavar="INDEX", help=argparse.SUPPRESS)

    _add_enqueue(commands)

    dashboard = commands.add_parser(
        "dashboard", help="serve the dashboard page without a daemon (see also metrics.listen)"
    )
    _config_arg(dashboard, positional=False)
    dashboard.add_argument(
        "--listen",
        metavar="HOST:PORT",
        default="127.0.0.1:9188",
        help="where to serve it (default 127.0.0.1:9188: this host only)",
    )

    _add_status(commands)
    _add_dlq(commands)
    _add_control(commands)
    _add_history(commands)
    commands.add_parser("schema", help="print the config's JSON Schema (Draft 2020-12)")
    script = commands.add_parser(
        "script", help="print a Lua script as jobd sends it, to call from other languages"
    )
    script.add_argument("name", metavar="NAME", help="e.g. schedule (jobd/store/lua/NAME.lua)")
    return parser


ENQUEUE_EPILOG = """\
exit status: 0 enqueued; 1 --lines/--ndjson: the input could not be read or the job ids not
written (stdout a closed pipe; stderr names the lines not sent); 2 a bad command line; 3
--unique and the job id is already there
(one job); 65 (EX_DATAERR) --lines/--ndjson: some line was refused (each is named on stderr as
FILE:LINE: why; the others are enqueued); 69 Redis cannot be reached, or could not take some
lines now; 75 --wait-*: enqueued, but not confirmed durable.
"""


def _add_enqueue(commands: argparse._SubParsersAction) -> None:
    enqueue = commands.add_parser(
        "enqueue",
        help="add jobs to a queue: one, or one per line of a file",
        epilog=ENQUEUE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _config_arg(enqueue, positional=False)
    enqueue.add_argument("queue", metavar="QUEUE")
    enqueue.add_argument("payload", nargs="?", metavar="PAYLOAD")
    enqueue.add_argument("--payload-file", metavar="F", help="read the payload from file F")
    enqueue.add_argument("--job-id", metavar="ID", help="the job's stable id (default: stream id)")
    _add_bulk(enqueue)
    when = enqueue.add_mutually_exclusive_group()
    when.add_argument(
        "--delay", metavar="DURATION", help="run it this long from now (e.g. 30s, 5m)"
    )
    when.add_argument(
        "--at",
        metavar="TIME",
        help="run it at TIME: ISO 8601 (e.g. 2026-12-01T09:00:00+00:00) or Unix seconds",
    )
    enqueue.add_argument(
        "--priority",
        metavar="LEVEL",
        help="one of the queue's priority levels (default: its default)",
    )
    enqueue.add_argument(
        "--unique",
        action="store_true",
        help="add it only if its --job-id is not already queued, running, or done within the "
        "queue's dedupe window (exit 3 otherwise; with --ndjson, each line's job_id, and a "
        "line already there is skipped, said on stderr)",
    )
    _add_limits(enqueue)
    _add_durability(enqueue)


def _add_bulk(enqueue: argparse.ArgumentParser) -> None:
    source = enqueue.add_mutually_exclusive_group()
    source.add_argument(
        "--lines",
        metavar="FILE",
        help="one job per line of FILE (- for stdin): the line is the payload, without its "
        "newline; blank lines are skipped",
    )
    source.add_argument(
        "--ndjson",
        metavar="FILE",
        help="one job per line of FILE (- for stdin), a JSON object: payload (or payload_b64), "
        "job_id, fields, delay, at, unique, timeout, max_attempts, expires_in, expires_at",
    )
    enqueue.add_argument(
        "--print-ids",
        action="store_true",
        help="with --lines/--ndjson: print the job ids added, one per line, in input order",
    )
    enqueue.add_argument(
        "--batch",
        metavar="N",
        type=int,
        default=1000,
        help="with --lines/--ndjson: jobs sent per round trip (default 1000); a batch goes "
        "when full or at the input's end, so 1 sends each line of a slow stream at once",
    )


def _add_limits(enqueue: argparse.ArgumentParser) -> None:
    enqueue.add_argument(
        "--timeout",
        metavar="DURATION",
        help="an attempt may run this long (field jobd_timeout; capped by the queue's timeout)",
    )
    enqueue.add_argument(
        "--max-attempts",
        metavar="N",
        type=int,
        help="attempts in all, the first included (field jobd_max_attempts; capped by the "
        "queue's retry.max_attempts)",
    )
    expiry = enqueue.add_mutually_exclusive_group()
    expiry.add_argument(
        "--expires-in",
        metavar="DURATION",
        help="not started within DURATION (on Redis's clock), it is not run "
        "(field jobd_expires_at)",
    )
    expiry.add_argument(
        "--expires-at",
        metavar="TIME",
        help="not started by TIME (as --at), it is not run (field jobd_expires_at)",
    )


def _add_durability(enqueue: argparse.ArgumentParser) -> None:
    enqueue.add_argument(
        "--wait-replicas",
        metavar="N",
        type=int,
        default=None,
        help="wait until N replicas have the job (WAIT); exit 75 if fewer do in time",
    )
    enqueue.add_argument(
        "--wait-aof",
        action="store_true",
        help="wait until the master's and N replicas' append-only files have the job on disk "
        "(WAITAOF, Redis 7.2+)",
    )
    enqueue.add_argument(
        "--wait-timeout",
        metavar="DURATION",
        default="1s",
        help="how long --wait-replicas / --wait-aof may wait (default 1s)",
    )


def _add_status(commands: argparse._SubParsersAction) -> None:
    status = commands.add_parser("status", help="backlog, leases, failures and consumers per queue")
    _config_arg(status, positional=False)
    status.add_argument("--json", action="store_true", help="print JSON")
    status.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=2.0,
        metavar="SECONDS",
        help="refresh every SECONDS (default 2) until interrupted",
    )


def _add_control(commands: argparse._SubParsersAction) -> None:
    """Operator controls, obeyed by every daemon on every host (the state lives in Redis)."""
    for name, what in (
        ("pause", "no daemon starts a new job of these queues (within a second) until resumed"),
        ("resume", "let paused queues run again"),
    ):
        command = commands.add_parser(name, help=what)
        _config_arg(command, positional=False)
        command.add_argument("queues", nargs="*", metavar="QUEUE")
        command.add_argument("--all", action="store_true", help="every queue of the config")
    cancel = commands.add_parser(
        "cancel",
        help="stop jobs wherever they are: running on any daemon, waiting, or delayed "
        "(exit 3 when none is found)",
    )
    _config_arg(cancel, positional=False)
    cancel.add_argument("queue", metavar="QUEUE")
    cancel.add_argument("job_ids", nargs="+", metavar="JOB_ID")
    cancel.add_argument(
        "--wait",
        default="1h",
        metavar="DURATION",
        help="how long a job not found yet stays cancelled if it is read later (default 1h)",
    )


def _add_dlq(commands: argparse._SubParsersAction) -> None:
    dlq = commands.add_parser("dlq", help="inspect and act on dead-lettered jobs")
    _config_arg(dlq, positional=False)
    dlq.add_argument("queue", metavar="QUEUE")
    actions = dlq.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="newest first, one line each")
    listing.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    show = actions.add_parser("show", help="one whole record")
    show.add_argument("ref", metavar="ID", help="record id or job id")
    requeue = actions.add_parser("requeue", help="back to the queue, attempts reset, job id kept")
    requeue.add_argument("refs", nargs="*", metavar="ID", help="record ids or job ids")
    requeue.add_argument("--all", action="store_true", help="every record")
    actions.add_parser("purge", help="delete every record")


JOB_EPILOG = """\
states: running (on which daemon, host and pid, since when, its deadline), delayed (due when),
waiting (in the stream), done, dead-lettered, expired, poison, cancelled (its last record), or
unknown: no record of it (a job that has not run yet is found only by its entry id).
exit status: 0 the job is known; 2 a bad command line; 3 its state is unknown; 69 Redis cannot be
reached.
"""

EVENTS_EPILOG = """\
events: done, retried, dead-lettered, expired, poison, cancelled, lease lost, reclaimed,
requeued, scheduled, promoted, handed back (a job's), and pause, resume, cancel, requeue, purge
(an operator's, with who: user@host). Each event's id is its time on Redis's clock: --json
prints it, and --after ID goes on from it.
exit status: 0 (a follow too, on SIGINT or SIGTERM); 2 a bad command line; 69 Redis cannot be
reached (a follow waits for it to come back, and goes on after the last event shown).
"""


def _add_history(commands: argparse._SubParsersAction) -> None:
    """What the history keeps (jobd.store.history): a job's attempts, a queue's events."""
    job = commands.add_parser(
        "job",
        help="a job's state now and each of its attempts: where, how it ended, its output",
        epilog=JOB_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _config_arg(job, positional=False)
    job.add_argument("queue", metavar="QUEUE")
    job.add_argument("job_id", metavar="JOB_ID", help="the job id (its entry id if none was set)")
    job.add_argument("--json", action="store_true", help="print JSON: the state and the records")
    events = commands.add_parser(
        "events",
        help="the queues' events, oldest first: outcomes and operator actions (--follow: live)",
        epilog=EVENTS_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _config_arg(events, positional=False)
    events.add_argument("queues", nargs="*", metavar="QUEUE", help="default: every queue")
    events.add_argument(
        "--follow", action="store_true", help="then print each new event until interrupted"
    )
    events.add_argument("--json", action="store_true", help="one JSON object a line, with its id")
    events.add_argument(
        "--count", type=int, default=20, metavar="N",
        help="the newest N events of them all (default 20); with --after, the first N after it",
    )  # fmt: skip
    events.add_argument(
        "--after", action="append", metavar="ID",
        help="the events after id ID (MS-SEQ, or MS: Redis ms); QUEUE=ID for one queue; "
        "may be given again",
    )  # fmt: skip
