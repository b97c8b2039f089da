"""`jobd pause`, `jobd resume` and `jobd cancel`: operator controls every daemon obeys, kept in
Redis (one script each, in the queue's slot), so they hold across hosts and restarts."""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from typing import Any

import redis

from jobd import exitcodes
from jobd.cancel import Stop, cancel, said, stop_waits, where
from jobd.cli.common import Unreachable, operator, print_json, queue_named, store_for, text
from jobd.config import Config, QueueConfig, durations
from jobd.logs import printable, word
from jobd.store.control import Found, Paused

Parser = argparse.ArgumentParser


def chosen(config: Config, args: argparse.Namespace, parser: Parser) -> list[QueueConfig]:
    """The queues named, or every queue with --all."""
    if args.all == bool(args.queues):
        parser.error(f"{args.command}: name queues, or --all")
    if args.all:
        return list(config.queues.values())
    return [queue_named(config, name, parser) for name in args.queues]


def run_control(config: Config, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.command == "cancel":
        return run_cancel(config, args, parser)
    queues = chosen(config, args, parser)
    done = []
    try:
        with store_for(config, args.command) as store:
            for q in queues:
                if args.command == "pause":
                    state, made = store.pause(q, operator())
                    done.append(paused_json(q, state, made))
                else:
                    ended = store.resume(q, operator())
                    done.append(resumed_json(q, ended))
                if not args.json:
                    say(pause_line(done[-1]) if args.command == "pause" else resume_line(done[-1]))
    except Unreachable:
        return exitcodes.UNAVAILABLE
    if args.json:
        print_json({"queues": done})
    return exitcodes.OK


def paused_json(q: QueueConfig, state: Paused, made: bool) -> dict[str, Any]:
    """What `jobd pause --json` says of a queue: the pause in force, and whether this made it."""
    return {"queue": q.name, "paused": True, "changed": made, "since": state.since_ms,
            "by": text(state.by)}  # fmt: skip


def resumed_json(q: QueueConfig, ended: Paused | None) -> dict[str, Any]:
    """What `jobd resume --json` says of a queue: the pause ended (null: it was not paused)."""
    was = None if ended is None else {"since": ended.since_ms, "by": text(ended.by)}
    return {"queue": q.name, "paused": False, "changed": ended is not None, "ended": was}


def pause_line(done: dict[str, Any]) -> str:
    if done["changed"]:
        return f"paused {done['queue']}: no daemon starts a new job of it until `jobd resume`"
    return f"{done['queue']} was already paused ({describe(done['since'], done['by'])})"


def resume_line(done: dict[str, Any]) -> str:
    ended = done["ended"]
    if ended is None:
        return f"{done['queue']} was not paused"
    return f"resumed {done['queue']} ({describe(ended['since'], ended['by'])})"


def describe(since_ms: int, by: str) -> str:
    since = datetime.datetime.fromtimestamp(since_ms / 1000, datetime.UTC)
    return f"paused since {since.isoformat(timespec='seconds')} by {by}"


def run_cancel(config: Config, args: argparse.Namespace, parser: Parser) -> int:
    """`jobd cancel`: where each job was found; exit 3 when none was found anywhere. With
    --wait: then wait until those found running are settled; exit 75 (TEMPFAIL) when one
    still runs at the end of its DURATION, 4 (UNCONFIRMED) when one was settled by another
    daemon than the one that ran it (its handler's end cannot be seen from Redis); 1 when
    Redis answered with an error."""
    queue = queue_named(config, args.queue, parser)
    unseen = _duration(parser, "--unseen-for", args.unseen_for)
    timeout = None if not args.wait else _duration(parser, "--wait", args.wait)
    found: list[Found] | None = None
    try:
        with store_for(config, "cancel") as store:
            found = cancel(store, queue, args.job_ids, int(unseen * 1000), operator())
            for f in found if not args.json else ():
                say(f"{word(f.job_id)}: {where(f, args.unseen_for)}")
            stops = stop_waits(store, queue, found, timeout) if args.wait is not None else []
    except Unreachable:
        return exitcodes.UNAVAILABLE
    except redis.ResponseError as exc:  # busy, out of memory, someone else's key: no traceback
        then = ("the cancel may be incomplete: run it again (a cancel can be repeated)"
                if found is None else "every job is cancelled; not confirmed that every job "
                "stopped")  # fmt: skip
        print(f"jobd cancel: Redis answered with an error: {printable(str(exc))}; {then}",
              file=sys.stderr)  # fmt: skip
        return exitcodes.FAILURE
    except KeyboardInterrupt:
        if found is None:  # some streams or delayed sets may not have been asked yet
            print("interrupted: the cancel may be incomplete (a job may not be cancelled); "
                  "run it again: a cancel can be repeated", file=sys.stderr)  # fmt: skip
        else:  # a --wait given up: the cancellations hold, the stop unconfirmed
            print("interrupted: every job is cancelled; not confirmed that every job stopped",
                  file=sys.stderr)  # fmt: skip
        return exitcodes.TEMPFAIL
    return cancelled(queue, args, found, stops)


def cancelled(queue: QueueConfig, args: argparse.Namespace, found: list[Found],
              stops: list[Stop]) -> int:  # fmt: skip
    """The end of `jobd cancel`: what --wait saw (or, with --json, the whole document) and
    the exit status."""
    if args.json:
        print_json({"queue": queue.name, "jobs": [found_json(f) for f in found],
                    "stops": [stop_json(stop) for stop in stops] if args.wait is not None
                    else None})  # fmt: skip
    elif args.wait is not None:
        for stop in stops:
            say(said(stop))
    if any(stop.state == "running" for stop in stops):
        return exitcodes.TEMPFAIL
    if any(stop.state == "unconfirmed" for stop in stops):
        return exitcodes.UNCONFIRMED
    return exitcodes.NOT_FOUND if all(f.where == "marked" for f in found) else exitcodes.OK


def found_json(f: Found) -> dict[str, Any]:
    """Where a job was found: ``found`` is running, waiting, delayed, held, or marked (nowhere yet:
    cancelled if it is read within --unseen-for)."""
    return {"job_id": text(f.job_id), "found": f.where, "consumer": text(f.consumer) or None,
            "entry": f.entry or None, "stream": f.stream or None,
            "due": f.due_ms if f.where == "delayed" else None}  # fmt: skip


def stop_json(stop: Stop) -> dict[str, Any]:
    """What --wait saw of a job found running: stopped, running, or unconfirmed (by whom)."""
    return {"job_id": text(stop.found.job_id), "state": stop.state, "by": text(stop.by) or None}


def say(line: str, escaped: bool = True) -> None:
    """One line on stdout (``printable`` when ``escaped``), flushed. A reader that closed it
    (`jobd cancel … | head`) has all it wanted: what is left is not shown, and the command goes
    on, every queue or job it names included (its exit status says what happened; a closed
    stdout is not Redis away)."""
    try:
        print(printable(line) if escaped else line, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush


def _duration(parser: Parser, option: str, value: str) -> float:
    try:
        seconds = durations.parse(value)
    except ValueError as exc:
        parser.error(f"{option}: {exc}")
    if seconds <= 0:
        parser.error(f"{option} {value}: must be more than 0")
    return seconds
