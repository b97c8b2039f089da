"""`jobd enqueue`: one job from the command line, or many (``--lines``/``--ndjson``, in
``jobd.cli.bulk``). The flags make one ``NewJob``: the job itself, or what every job of a bulk
run starts from; ``jobd.producer`` adds them."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from jobd import exitcodes
from jobd.cli.common import print_json, queue_named, text
from jobd.cli.workflow import check_enqueue_flags
from jobd.config import Config, durations
from jobd.newjob import NewJob, check_limits, check_trace, parse_time
from jobd.producer import Durability
from jobd.waiting import JobFailed, Pending, WaitError, WaitRefused, WaitTimeout
from jobd.workflows import check_after_timeout


def run_enqueue(config: Config, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """`jobd enqueue`: checks the command line, then adds the job or jobs it names."""
    queue_named(config, args.queue, parser)
    if args.priority is not None:
        try:
            config.queues[args.queue].level(args.priority)
        except ValueError as exc:
            parser.error(f"--priority {args.priority}: {exc}")
    check_enqueue_flags(config, args, parser)
    template = job_of(args, parser)
    if args.wait and (args.lines is not None or args.ndjson is not None):
        parser.error("--wait waits for one job: not with --lines or --ndjson (the Python "
                     "API's producer.submit waits for each)")  # fmt: skip
    if args.lines is not None or args.ndjson is not None:
        from jobd.cli.bulk import run_bulk

        return run_bulk(config, args, parser, template)
    if args.print_ids:
        parser.error("--print-ids goes with --lines or --ndjson (one job's id is always printed)")
    if args.unique and args.job_id is None:
        parser.error("--unique needs --job-id: uniqueness is per job id")
    payload = read_payload(args, parser)
    if payload is None:
        return exitcodes.USAGE
    job = NewJob(payload, args.job_id, **_attributes(template))
    return enqueue_one(config, args, parser, job)


def enqueue_one(
    config: Config, args: argparse.Namespace, parser: argparse.ArgumentParser, job: NewJob
) -> int:
    """Add ``job``; print its job id. Exit 3 for a --unique duplicate, 75 when not confirmed
    durable, 69 when Redis cannot be reached."""
    from jobd import producer

    durability = durability_of(args, parser)
    try:
        if args.wait:
            timeout = _duration(args.wait_timeout, "--wait-timeout")
            pending = producer.submit(config, args.queue, job, args.priority, None, durability)
            return waited(args, pending, timeout, True if durability is not None else None)
        job_id = producer.enqueue_job(config, args.queue, job, args.priority, None, durability)
    except ValueError as exc:
        parser.error(str(exc))
    except producer.Duplicate as exc:
        print(f"jobd: {exc}", file=sys.stderr)
        return exitcodes.DUPLICATE
    except producer.NotDurable as exc:
        said(args, exc.job_id, durable=False)
        print(f"jobd: {exc}", file=sys.stderr)
        return exitcodes.TEMPFAIL
    except producer.ProducerError as exc:
        print(f"jobd: {exc}", file=sys.stderr)
        return exitcodes.UNAVAILABLE
    said(args, job_id, durable=True if durability is not None else None)
    return exitcodes.OK


def waited(
    args: argparse.Namespace, pending: Pending, timeout: float | None, durable: bool | None
) -> int:
    """--wait: the job's end, waited for ``timeout`` seconds at most (None: no limit). Done:
    its result on stdout as it is (with --json, in the JSON document), exit 0; else the exit
    code of how it ended (``ENDED``: deduped, its earlier run's result, is as good as done),
    or WAIT_TIMEOUT; FAILURE when Redis refuses a read the wait needs (WRONGTYPE)."""
    try:
        ended = pending.outcome(timeout)
    except WaitTimeout as exc:
        print(f"jobd: {exc} (it goes on)", file=sys.stderr)
        return exitcodes.WAIT_TIMEOUT
    except WaitRefused as exc:  # one line, as any error Redis answers
        print(f"jobd: {exc}", file=sys.stderr)
        return exitcodes.FAILURE
    except WaitError as exc:
        print(f"jobd: {exc}", file=sys.stderr)
        return exitcodes.UNAVAILABLE
    except KeyboardInterrupt:  # the job goes on without the waiter
        return 128 + signal.SIGINT
    if args.json:
        result = None if ended.result is None else text(ended.result)
        print_json({"queue": args.queue, "job_id": text(pending.job_id), "durable": durable,
                    "ended": ended.event, "error": ended.fields.get("error"),
                    "result": result})  # fmt: skip
    elif ended.done and ended.result:
        sys.stdout.buffer.write(ended.result)
        sys.stdout.flush()
    if not ended.done:
        print(f"jobd: {JobFailed(ended)}", file=sys.stderr)
    return ENDED.get(ended.event, exitcodes.JOB_DEAD)


# --wait's exit code for each end (every other: dead-lettered, poison, malformed)
ENDED = {"done": exitcodes.OK, "deduped": exitcodes.OK, "cancelled": exitcodes.JOB_CANCELLED,
         "expired": exitcodes.JOB_EXPIRED}  # fmt: skip


def said(args: argparse.Namespace, job_id: str, durable: bool | None) -> None:
    """The job id added, on a line; with --json one JSON document: the queue, the job id, and
    whether it was confirmed durable (null: --wait-* not asked). With --wait: nothing (the
    result is what stdout carries; with --json, the end's document names the job)."""
    if args.wait:
        return
    if args.json:
        print_json({"queue": args.queue, "job_id": text(job_id), "durable": durable})
    else:
        print(job_id)


def job_of(args: argparse.Namespace, parser: argparse.ArgumentParser) -> NewJob:
    """The job the flags describe, payload and job id aside; a bad flag is a usage error."""
    try:
        at, delay = when_to_run(args)
        job = NewJob(
            delay=delay,
            at=at,
            unique=args.unique,
            timeout=_duration(args.timeout, "--timeout"),
            max_attempts=args.max_attempts,
            expires_in=_duration(args.expires_in, "--expires-in"),
            expires_at=None
            if args.expires_at is None
            else parse_time(args.expires_at, "--expires-at"),
            traceparent=args.traceparent,
            tracestate=args.tracestate,
            baggage=args.baggage,
            batch=args.batch,
            on_complete=args.on_complete,
            after=tuple(args.after or ()),
            after_any=args.after_any_outcome,
            after_timeout=_duration(args.after_timeout, "--after-timeout"),
        )
        check_limits(job)
        check_trace(job)
        if job.after_timeout is not None:
            check_after_timeout(job.after_timeout, "--after-timeout")
    except ValueError as exc:
        parser.error(str(exc))
    return job


def _attributes(job: NewJob) -> dict[str, object]:
    """What the flags set, to build each job from (payload, job id and fields left out)."""
    return {
        "delay": job.delay,
        "at": job.at,
        "unique": job.unique,
        "timeout": job.timeout,
        "max_attempts": job.max_attempts,
        "expires_in": job.expires_in,
        "expires_at": job.expires_at,
        "traceparent": job.traceparent,
        "tracestate": job.tracestate,
        "baggage": job.baggage,
        "batch": job.batch,
        "on_complete": job.on_complete,
        "after": job.after,
        "after_any": job.after_any,
        "after_timeout": job.after_timeout,
    }


def _duration(text: str | None, flag: str) -> float | None:
    if text is None:
        return None
    try:
        return durations.parse(text)
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from None


def read_payload(args: argparse.Namespace, parser: argparse.ArgumentParser) -> bytes | None:
    """The payload: PAYLOAD, the file --payload-file names, else stdin; None (said on stderr)
    when the file cannot be read."""
    if args.payload is not None and args.payload_file:
        parser.error("give the payload once: PAYLOAD or --payload-file")
    if args.payload is not None:
        return os.fsencode(args.payload)
    if not args.payload_file:
        return sys.stdin.buffer.read()
    try:
        with open(args.payload_file, "rb") as f:
            return f.read()
    except OSError as exc:
        print(f"jobd: cannot read {args.payload_file}: {exc.strerror}", file=sys.stderr)
        return None


def durability_of(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Durability | None:
    """What --wait-replicas / --wait-aof ask to wait for after the write; None for nothing."""
    if args.wait_replicas is None and not args.wait_aof:
        return None
    replicas = args.wait_replicas or 0
    if replicas < 0:
        parser.error("--wait-replicas: give 0 or more")
    try:
        timeout = durations.parse(args.wait_timeout or "1s")
    except ValueError as exc:
        parser.error(f"--wait-timeout: {exc}")
    return Durability(replicas, args.wait_aof, timeout)


def when_to_run(args: argparse.Namespace) -> tuple[float | None, float | None]:
    """(Unix time from --at, seconds from --delay); (None, None) for now. A delay is sent as
    such: Redis's clock, not this host's, decides when it ends."""
    if args.delay is not None:
        return None, _duration(args.delay, "--delay")
    if args.at is None:
        return None, None
    return parse_time(args.at, "--at"), None
