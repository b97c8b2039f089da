"""Review 34p of issue 34: an attempt that ends released (Verb.RELEASE) never ends its span.

8fd0b8c settles every attempt end through ``Admission.ended``, which ends jobd's span of the
attempt (``tracing.ended``). Its test (tests/test_review34o_span_start_failure.py) stands in
for ``tracing.Spans`` with an ``end`` of its own, so it never runs the real one, whose first
step is ``span.set_attribute("jobd.outcome", notes.event_of(outcome))``: ``notes.EVENTS`` has
no entry for Verb.RELEASE, ``event_of`` raises KeyError, ``tracing.ended`` catches it ("cannot
end a span", a traceback in the daemon's log at each such end) and the span is never ended,
so never exported. Every released end is hit: a running handler whose lease was lost (another
daemon took the entry over: ``policy.decide`` -> RELEASE, the commonest one), a lapsed start
whose lease was lost, and the releases 8fd0b8c added (``Endings.released``: an internal error
deciding an end, the follow-ups thread that cannot start).

Reproduced with a daemon in this process (``test_loop.Loop``), the entry carrying a
producer's traceparent, jobd's spans the real ``tracing.Spans.end`` over a stand-in span (no
SDK needed: ``end`` only calls the span's ``set_attribute``/``set_status``/``end``).

Should: the attempt's span ends (with an error status; ``jobd.outcome`` some word for a
release, "released" as the journal's JOBD_OUTCOME says it), no "cannot end a span" logged.
Suggested fix: give Verb.RELEASE a word for spans (``Spans.end`` not through ``event_of``, or
EVENTS/``event_of`` knowing it: notes never write a release, so it changes no record), and
make the test of 34o use the real ``Spans.end``.

Fixed (jobd/tracing.py): ``Spans.end`` says an outcome by ``tracing.said``: the event its note
writes (``notes.event_of``), and for a release, which writes none, ``released`` (the journal's
JOBD_OUTCOME word, ``outcome.JOURNAL_OUTCOME``); notes' EVENTS, the events stream's and the
history's vocabulary, unchanged.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
import redis
from support import wait_group
from test_endings_faults import opened  # noqa: F401  (a fixture)
from test_loop import STREAM, Loop

from jobd import tracing
from jobd.daemon import lease
from jobd.outcome import Verb
from jobd.process import policy

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Span:
    """What the daemon asks of an OpenTelemetry span (``tracing.Spans.end``)."""

    def __init__(self) -> None:
        self.attributes: dict[str, object] = {}
        self.status: object = None
        self.ended = False

    def set_attribute(self, name: str, value: object) -> None:
        self.attributes[name] = value

    def set_status(self, status: object) -> None:
        self.status = status

    def end(self, end_time: int | None = None) -> None:
        self.ended = True


class Spans(tracing.Spans):
    """The real ``tracing.Spans.end``; ``start`` makes a stand-in span (no SDK)."""

    def __init__(self) -> None:  # the SDK's setup left out
        self.error = "ERROR"
        self.spans: dict[str, Span] = {}

    def start(self, job: Any, queue: Any) -> tuple[Any, str]:
        span = self.spans[job.job_id] = Span()
        return span, PARENT

    def shutdown(self) -> None:
        pass


@pytest.mark.parametrize("how", ["lease-lost", "deciding", "follow-ups-thread"])
def test_a_released_attempt_ends_its_span(
    r: redis.Redis,
    write_config,
    script,
    opened: list[Loop],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    how: str,
) -> None:
    spans = Spans()
    monkeypatch.setattr(tracing, "_spans", spans)
    body = "sleep 30" if how == "lease-lost" else 'echo \'{"queue": "q2"}\' > "$JOBD_ENQUEUE"'
    handler = script("h.sh", f"#!/bin/sh\n{body}\n")
    cfg = write_config(
        "redis: {url: '{redis}'}\nshutdown_grace: 200ms\nqueues:\n"
        f"  q: {{stream: {STREAM}, command: [{handler}]}}\n"
        "  q2: {stream: 'jobd:q2', command: [/bin/true]}\n"
    )
    said = logging.getLogger("jobd.tracing")
    said.addHandler(caplog.handler)  # the daemon's loggers may not propagate
    try:
        loop = Loop(cfg)
        opened.append(loop)
        wait_group(r, STREAM)
        if how == "deciding":  # a bug deciding its outcome: released (``Endings.release``)
            monkeypatch.setattr(policy, "of_handler", lambda *args, **kwargs: 1 / 0)
        elif how == "follow-ups-thread":  # a task limit: released (``Endings.released``)
            real = threading.Thread.start

            def start(self: threading.Thread) -> None:
                if self.name == "jobd-follow-ups":
                    raise RuntimeError("can't start new thread")
                real(self)

            monkeypatch.setattr(threading.Thread, "start", start)
        mid = r.xadd(STREAM, {"payload": "x", "job_id": "j1", "traceparent": PARENT}).decode()
        if how == "lease-lost":  # another daemon takes the entry over while it runs
            loop.handler()
            r.xclaim(STREAM, "jobd", "another-daemon", 0, [mid])
            queue = loop.daemon.config.queues["q"]
            loop.until(lambda: not loop.daemon.holdings.holds(lease.key(queue), mid), "the loss")
        outcome = loop.outcome()
    finally:
        said.removeHandler(caplog.handler)
    assert outcome.verb is Verb.RELEASE, (outcome.verb, outcome.error)
    span = spans.spans["j1"]
    assert "cannot end a span" not in caplog.text, caplog.text
    assert span.ended, f"the attempt was released and its span never ended: {span.attributes}"
    assert span.status == "ERROR"
