"""`jobd pause` and `jobd resume`: operator controls every daemon obeys, kept in Redis (one
script each, in the queue's slot), so they hold across hosts and restarts."""

from __future__ import annotations

import argparse
import datetime

from jobd import exitcodes
from jobd.cancel import cancel, where
from jobd.cli.common import Unreachable, operator, queue_named, store_for
from jobd.config import Config, QueueConfig, durations
from jobd.logs import printable
from jobd.store.control import Paused
from jobd.store.store import Store

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
    try:
        with store_for(config, args.command) as store:
            for q in queues:
                print(pause(store, q) if args.command == "pause" else resume(store, q))
    except Unreachable:
        return exitcodes.UNAVAILABLE
    return exitcodes.OK


def pause(store: Store, q: QueueConfig) -> str:
    state, made = store.pause(q, operator())
    if made:
        return f"paused {q.name}: no daemon starts a new job of it until `jobd resume`"
    return f"{q.name} was already paused ({describe(state)})"


def resume(store: Store, q: QueueConfig) -> str:
    ended = store.resume(q, operator())
    return f"resumed {q.name} ({describe(ended)})" if ended else f"{q.name} was not paused"


def describe(state: Paused) -> str:
    since = datetime.datetime.fromtimestamp(state.since_ms / 1000, datetime.UTC)
    return f"paused since {since.isoformat(timespec='seconds')} by {state.by}"


def run_cancel(config: Config, args: argparse.Namespace, parser: Parser) -> int:
    """`jobd cancel`: where each job was found; exit 3 when none was found anywhere."""
    queue = queue_named(config, args.queue, parser)
    try:
        wait = durations.parse(args.wait)
    except ValueError as exc:
        parser.error(f"--wait: {exc}")
    least = queue.lease.renew_every + 1
    if wait < least:  # a mark must outlive the renewal that carries it to a running job
        parser.error(f"--wait {args.wait}: at least lease.renew_every + 1s ({least:g}s)")
    try:
        with store_for(config, "cancel") as store:
            found = cancel(store, queue, args.job_ids, int(wait * 1000), operator())
    except Unreachable:
        return exitcodes.UNAVAILABLE
    for f in found:
        print(printable(f"{f.job_id}: {where(f, args.wait)}"))
    return exitcodes.NOT_FOUND if all(f.where == "marked" for f in found) else exitcodes.OK
