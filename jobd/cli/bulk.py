"""`jobd enqueue --lines FILE|-` and `--ndjson FILE|-`: one job per line of a file or of stdin,
sent ``--chunk`` to a round trip (``producer.enqueue_many``).

``--lines``: the line is the payload, without its newline (``\\n``, or ``\\r\\n``). A blank line
(empty, or only spaces and tabs) is skipped, not refused: an operator's file has them by
accident. An empty payload is given with ``--ndjson`` (``{"payload": ""}``).
``--ndjson``: each line is a JSON object (``NDJSON_KEYS``): ``payload`` (a string, sent as
its UTF-8 bytes; any other JSON value is sent as compact JSON) or ``payload_b64`` (base64, for
binary); ``job_id``; ``fields`` (an object of string values); ``delay``, ``timeout``,
``expires_in`` (a duration: "30s", or seconds); ``at``, ``expires_at`` (ISO 8601 or Unix
seconds); ``unique`` (true/false); ``max_attempts``; ``traceparent``, ``tracestate``,
``baggage`` (W3C trace context, ``jobd.trace``). A key on a line overrides the flag of the
same kind (``delay`` or ``at`` both of --delay and --at; a trace key all three trace flags).

A line that cannot be a job is named on stderr as ``FILE:LINE: why`` and the others are still
enqueued; so is a job Redis refused. A payload above the queue's ``max_payload`` is refused
(``--lines`` reads such a line through without holding it). A progress line (count, rate) is
drawn on stderr only when it is a terminal; a summary line ends the run. ``--print-ids``
prints the ids of the jobs added, one a line, in input order.

A run that stops early says which lines were not sent (``lines N and after``): exit 69 when
Redis went away (the lines being sent are named too: they may or may not be enqueued), 1 when
the input could not be read or the job ids could not be written (a closed pipe on stdout).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import BinaryIO, TextIO

import orjson

from jobd import exitcodes, producer
from jobd.cli.common import text
from jobd.config import Config
from jobd.logs import printable, safe_json
from jobd.ndjson import job_from_json
from jobd.newjob import NewJob
from jobd.workflows import WorkflowError

PROGRESS_EVERY = 0.2  # seconds between redraws of the progress line
SKIP_CHUNK = 2**20  # bytes read at a time through a --lines line too long to hold


class StreamError(Exception):
    """The input could not be read to its end, or the job ids not written: not Redis's
    failure (the producer takes an OSError for one), nor a line's."""


def run_bulk(
    config: Config, args: argparse.Namespace, parser: argparse.ArgumentParser, template: NewJob
) -> int:
    """Enqueue every line of the input; exit 0, 65 when a line was refused, 69 when Redis
    could not be reached (or could not take some lines now), 1 when the input could not be
    read or the ids not written."""
    _check_args(args, parser)
    path = args.lines if args.lines is not None else args.ndjson
    try:
        stream = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115
    except OSError as exc:
        print(f"jobd: cannot read {path}: {exc.strerror}", file=sys.stderr)
        return exitcodes.USAGE
    report = Report("<stdin>" if path == "-" else path, args.print_ids or args.json)
    report.as_json = args.json
    largest = config.queues[args.queue].max_payload
    reader = Reader(stream, template, report, args.ndjson is not None, largest)
    try:
        return send(config, args, reader, report)
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


def send(config: Config, args: argparse.Namespace, reader: Reader, report: Report) -> int:
    """Send the jobs ``reader`` reads; the exit status (``run_bulk``)."""
    try:
        producer.enqueue_many(
            config, args.queue, reader.jobs(), args.priority, None, args.chunk,
            on_batch=lambda outcomes: report.batch(outcomes, reader.pending),
        )  # fmt: skip
    except StreamError as exc:
        report.stopped(exc, deque(), reader.not_sent(sending=False))
        return exitcodes.FAILURE
    except WorkflowError as exc:  # a complete batch: nothing was sent
        print(f"jobd: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    except producer.ProducerError as exc:
        report.stopped(exc, reader.pending, reader.not_sent(sending=True))
        return exitcodes.UNAVAILABLE
    return report.finish()


def _check_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Refuse what does not go with a bulk enqueue."""
    flag = "--lines" if args.lines is not None else "--ndjson"
    if args.payload is not None or args.payload_file:
        parser.error(f"{flag} reads the payloads: give no PAYLOAD nor --payload-file")
    if args.job_id is not None:
        parser.error(f"{flag}: each job has its own job id (--ndjson: the job_id key)")
    if args.wait_replicas is not None or args.wait_aof:
        parser.error(f"--wait-replicas/--wait-aof are for one job, not with {flag}")
    if args.unique and args.lines is not None:
        parser.error("--unique needs job ids: use --ndjson, with a job_id on each line")
    if args.chunk < 1:
        parser.error("--chunk: give 1 or more")


class Reader:
    """The jobs of an input, one a line; a line refused is reported, not yielded. The line
    numbers of the jobs yielded and not yet settled wait in ``pending``, in order; ``read``
    is the number of the last line read, ``ended`` whether the input was read to its end."""

    def __init__(
        self, stream: BinaryIO, template: NewJob, report: Report, ndjson: bool, largest: int
    ) -> None:
        self.stream, self.template, self.report = stream, template, report
        self.parse: Callable[[bytes], NewJob] = self._from_json if ndjson else self._from_line
        # --lines: a line is its payload, so one longer than this is refused unread (\r\n aside)
        self.largest, self.longest = largest, None if ndjson else largest + 2
        self.pending: deque[int] = deque()
        self.read, self.ended, self.failed = 0, False, False

    def jobs(self) -> Iterator[NewJob]:
        try:
            for line in _lines(self.stream, self.longest):
                self.read += 1
                job = self._job(self.read, line)
                if job is not None:
                    self.pending.append(self.read)
                    yield job
        except OSError as exc:
            self.failed = True
            raise StreamError(f"cannot read line {self.read + 1}: {exc.strerror or exc}") from exc
        self.ended = True

    def _job(self, number: int, line: bytes | int) -> NewJob | None:
        """The job of a line; None for a blank line, or one refused (said)."""
        if isinstance(line, int):
            self.report.refused_line(
                number, f"a line of {line} bytes: above the queue's max_payload ({self.largest})"
            )
            return None
        body = line[:-1] if line.endswith(b"\n") else line
        body = body[:-1] if body.endswith(b"\r") else body
        if not body.strip(b" \t"):
            return None
        try:
            return self.parse(body)
        except ValueError as exc:
            self.report.refused_line(number, str(exc))
            return None

    def not_sent(self, sending: bool) -> str | None:
        """The lines a run that stopped now did not send, in words; None for none. The lines
        in ``pending`` were ``sending`` (they may be enqueued), or were not sent at all."""
        if self.pending and not sending:
            return f"lines {self.pending[0]} and after"
        if self.failed:
            return f"lines {self.read + 1} and after"
        return None if self.ended else f"lines {self.read + 1} and after (if any)"

    def _from_line(self, body: bytes) -> NewJob:
        return dataclasses.replace(self.template, payload=body)

    def _from_json(self, body: bytes) -> NewJob:
        return job_from_json(body, self.template)


def _lines(stream: BinaryIO, longest: int | None) -> Iterator[bytes | int]:
    """The lines of ``stream``, each with its newline; for a line of more than ``longest``
    bytes, its length instead: read through, never held whole."""
    if longest is None:
        yield from stream
        return
    while line := stream.readline(longest + 1):
        if len(line) <= longest or line.endswith(b"\n"):
            yield line
            continue
        size = len(line)
        while rest := stream.readline(SKIP_CHUNK):
            size += len(rest)
            if rest.endswith(b"\n"):
                break
        yield size


class Report:
    """What the run tells: each line not added (stderr), the ids added (stdout, with
    ``print_ids``), a progress line while stderr is a terminal, a summary at the end."""

    def __init__(self, name: str, print_ids: bool, err: TextIO | None = None) -> None:
        self.name, self.print_ids = name, print_ids
        self.as_json = False  # --json: the ids as NDJSON objects, with their lines
        self.err = err or sys.stderr
        self.added = self.refused = self.duplicates = self.temporary = 0
        self.started = time.monotonic()
        self.held: deque[tuple[int, str]] = deque()  # lines refused, not yet said
        self.progress = Progress(self.err) if self.err.isatty() else None

    def say(self, line: str) -> None:
        if self.progress is not None:
            self.progress.clear()
        print(printable(line), file=self.err)

    def refused_line(self, number: int, why: str) -> None:
        """A line that is no job: said when the jobs before it are settled (lines in order)."""
        self.refused += 1
        self.held.append((number, why))

    def _said_up_to(self, number: float) -> None:
        while self.held and self.held[0][0] < number:
            line, why = self.held.popleft()
            self.say(f"{self.name}:{line}: {why}")

    def batch(self, outcomes: list[producer.Outcome], pending: deque[int]) -> None:
        """A batch's outcomes, in the order of ``pending``'s line numbers."""
        ids: list[tuple[int, str]] = []
        first, last = pending[0], pending[len(outcomes) - 1]
        for outcome in outcomes:
            number = pending.popleft()
            self._said_up_to(number)
            if isinstance(outcome, str):
                ids.append((number, outcome))
                continue
            if outcome.duplicate:
                self.duplicates += 1
            elif outcome.temporary:
                self.temporary += 1
            else:
                self.refused += 1
            self.say(f"{self.name}:{number}: {outcome.reason}")
        self.added += len(ids)
        if self.print_ids and ids:
            try:
                sys.stdout.buffer.write(b"".join(map(self.id_line, ids)))
                sys.stdout.buffer.flush()
            except OSError as exc:
                raise StreamError(
                    f"cannot write the job ids of lines {first} to {last} (settled: enqueued "
                    f"unless named above): {exc.strerror or exc}"
                ) from exc
        if self.progress is not None:
            self.progress.show(self.added, self.started)

    def id_line(self, added: tuple[int, str]) -> bytes:
        """A job id printed: the id (``--print-ids``), or with ``--json`` an object with the
        line it came from (NDJSON)."""
        number, job_id = added
        if not self.as_json:
            return os.fsencode(job_id) + b"\n"
        return safe_json(orjson.dumps({"line": number, "job_id": text(job_id)})) + b"\n"

    def stopped(self, exc: Exception, sending: deque[int], not_sent: str | None) -> None:
        """The run stopped (Redis went away, or the input or output failed): say which lines
        may or may not be enqueued (``sending``), which were not sent, then the summary."""
        self._said_up_to(sending[0] if sending else math.inf)
        self.say(f"jobd: {exc}")
        if sending:
            self.say(
                f"jobd: {self.name}: lines {sending[0]} to {sending[-1]} were being sent: they "
                f"may or may not be enqueued; the lines before them are settled"
            )
        self._said_up_to(math.inf)
        if not_sent is not None:
            self.say(f"jobd: {self.name}: {not_sent} were not sent: none of them is enqueued")
        self.finish()

    def finish(self) -> int:
        """The summary line; the exit status the counts make."""
        self._said_up_to(math.inf)
        seconds = time.monotonic() - self.started
        parts = [f"{self.added} enqueued", f"{self.refused} refused"]
        if self.duplicates:
            parts.append(f"{self.duplicates} already there (--unique)")
        if self.temporary:
            parts.append(f"{self.temporary} not taken by Redis now (send them again)")
        rate = self.added / seconds if seconds > 0 else 0.0
        self.say(f"jobd: {', '.join(parts)} in {seconds:.1f}s ({rate:,.0f} jobs/s)")
        if self.refused:
            return exitcodes.DATAERR
        return exitcodes.UNAVAILABLE if self.temporary else exitcodes.OK


class Progress:
    """A count and a rate on one line of a terminal, redrawn at most every PROGRESS_EVERY."""

    def __init__(self, err: TextIO) -> None:
        self.err = err
        self.drawn_at = 0.0
        self.visible = False

    def show(self, added: int, started: float) -> None:
        now = time.monotonic()
        if now - self.drawn_at < PROGRESS_EVERY:
            return
        rate = added / (now - started) if now > started else 0.0
        self.err.write(f"\r\x1b[K{added:,} enqueued, {rate:,.0f} jobs/s")
        self.err.flush()
        self.drawn_at, self.visible = now, True

    def clear(self) -> None:
        if self.visible:
            self.err.write("\r\x1b[K")
            self.visible = False
