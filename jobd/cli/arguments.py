"""The command line's grammar: each command of ``jobd`` and the arguments it takes
(``build_parser``); what the commands do is in ``main``."""

from __future__ import annotations

import argparse
import os

from jobd import __version__
from jobd.cli import exits, notify, workflow
from jobd.configpath import DEFAULT_CONFIG


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
    notify.add_arguments(commands)
    _add_completion(commands)
    _with_exit_codes(parser)
    return parser


def _with_exit_codes(parser: argparse.ArgumentParser) -> None:
    """End every command's --help (its subcommands' too) with the exit-code table, after the
    notes it has (``exits``)."""
    raw = argparse.RawDescriptionHelpFormatter
    parser.epilog, parser.formatter_class = exits.epilog(None), raw
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        for name, command in action.choices.items():
            stack = [command]
            while stack:
                sub = stack.pop()
                sub.epilog, sub.formatter_class = exits.epilog(name, sub.epilog or ""), raw
                stack += [p for a in sub._actions if isinstance(a, argparse._SubParsersAction)
                          for p in a.choices.values()]  # fmt: skip


def _add_completion(commands: argparse._SubParsersAction) -> None:
    completion = commands.add_parser(
        "completion", help="print a shell completion script for jobd (from this parser)"
    )
    completion.add_argument("shell", choices=("bash", "zsh", "fish"), metavar="SHELL",
                            help="bash, zsh or fish")  # fmt: skip


def _add_enqueue(commands: argparse._SubParsersAction) -> None:
    enqueue = commands.add_parser(
        "enqueue",
        help="add jobs to a queue: one, or one per line of a file",
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
    _add_trace(enqueue)
    _add_durability(enqueue)
    workflow.add_enqueue_flags(enqueue)


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
        "job_id, fields, delay, at, unique, timeout, max_attempts, expires_in, expires_at, "
        "traceparent, tracestate, baggage",
    )
    enqueue.add_argument(
        "--json",
        action="store_true",
        help="one job: print one JSON document (queue, job_id, durable); --lines/--ndjson: "
        "each job id added as NDJSON, one object a line: line (of the input), job_id",
    )
    enqueue.add_argument(
        "--print-ids",
        action="store_true",
        help="with --lines/--ndjson: print the job ids added, one per line, in input order",
    )
    enqueue.add_argument(
        "--chunk",
        metavar="N",
        type=int,
        default=1000,
        help="with --lines/--ndjson: jobs sent per round trip (default 1000); a chunk goes "
        "when full or at the input's end, so 1 sends each line of a slow stream at once "
        "(was --batch N before --batch ID named a batch of jobs)",
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


def _add_trace(enqueue: argparse.ArgumentParser) -> None:
    """The W3C trace context the handler gets (jobd.trace); none given: the environment's."""
    enqueue.add_argument(
        "--traceparent",
        metavar="VALUE",
        help="the W3C traceparent the handler gets as TRACEPARENT (field traceparent); "
        "without any of these three flags, this process's TRACEPARENT, TRACESTATE and BAGGAGE "
        "are sent; '' sends none",
    )
    enqueue.add_argument(
        "--tracestate", metavar="VALUE", help="its W3C tracestate (TRACESTATE, field tracestate)"
    )
    enqueue.add_argument("--baggage", metavar="VALUE", help="W3C baggage (BAGGAGE, field baggage)")


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
        "--wait",
        action="store_true",
        help="return when the job has ended: print its result to stdout and exit 0 when done; "
        "5 dead-lettered, 6 cancelled, 7 expired, 124 --wait-timeout passed (one job only)",
    )
    enqueue.add_argument(
        "--wait-timeout",
        metavar="DURATION",
        default=None,
        help="how long --wait may wait for the job's end (default: as long as it takes), and "
        "--wait-replicas / --wait-aof for the replicas (default 1s)",
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
        command.add_argument(
            "--json", action="store_true",
            help="print one JSON document: each queue, whether it is paused, whether this "
            "changed it, and since when and by whom",
        )  # fmt: skip
    cancel = commands.add_parser(
        "cancel",
        help="stop jobs wherever they are: running on any daemon, waiting, or delayed "
        "(exit 3 when none is found; with --wait, 75 when one still runs at its end)",
    )
    _config_arg(cancel, positional=False)
    cancel.add_argument("queue", metavar="QUEUE")
    cancel.add_argument("job_ids", nargs="+", metavar="JOB_ID")
    cancel.add_argument(
        "--wait",
        nargs="?",
        const="",
        default=None,
        metavar="DURATION",
        help="return once every job found running is settled, or after DURATION at most (exit "
        "75 then); no DURATION: as long as it takes. 'stopped' (exit 0): the daemon that ran "
        "it wrote its outcome, its handler ended; exit 4 when one was settled by another "
        "daemon (taken over from one dead or cut off from Redis): its handler's end there "
        "cannot be seen from Redis",
    )
    cancel.add_argument(
        "--json", action="store_true",
        help="print one JSON document at the end: where each job was found, and (--wait) "
        "how each job found running ended",
    )  # fmt: skip
    cancel.add_argument(
        "--unseen-for",
        default="1h",
        metavar="DURATION",
        help="how long a job found nowhere (not running, waiting or delayed) stays cancelled "
        "if it is read later (default 1h); a job found running or waiting stays cancelled "
        "until it is settled",
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
    purge = actions.add_parser(
        "purge", help="delete every record (asks first on a terminal; --yes: without asking)"
    )
    purge.add_argument(
        "-y", "--yes", action="store_true",
        help="do not ask; needed when stdin is not a terminal (a script, a pipe)",
    )  # fmt: skip
    for action in (listing, show, requeue, purge):
        action.add_argument("--json", action="store_true", help=JSON_HELP[action.prog.split()[-1]])


JSON_HELP = {
    "list": "print one JSON document: the queue, its dead-letter stream and the records",
    "show": "print the record as one JSON document",
    "requeue": "print one JSON document: the record ids requeued, those left in place and why",
    "purge": "print one JSON document: how many records were deleted",
}


JOB_EPILOG = """\
states: running (on which daemon, host and pid, since when, its deadline), cancelling (the same,
once `jobd cancel` asked it to stop, until its handler ends), delayed (due when), waiting (in
the stream), done, dead-lettered, expired, poison, cancelled (its last record), or
unknown: no record of it (a job that has not run yet is found only by its entry id).
"""

EVENTS_EPILOG = """\
events: done, retried, dead-lettered, expired, poison, cancelled, lease lost, reclaimed,
requeued, scheduled, promoted, handed back (a job's), and pause, resume, cancel, requeue, purge
(an operator's, with who: user@host). Each event's id is its time on Redis's clock. --json
prints it, and `after`: every queue's position once the event is handled; --after AFTER goes on
right after that event (one id alone can miss another queue's event of the same millisecond).
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
        help="the events after id ID (MS-SEQ, or MS: Redis ms; now: the newest event when "
        "the command starts, so --after now --follow prints only new events); QUEUE=ID for "
        "one queue; "
        "may be given again, or comma-separated (a --json event's `after`; queues it names "
        "that are not read are left out)",
    )  # fmt: skip
    workflow.add_batch_command(commands, _config_arg)
