"""Review 34o of issue 34: an attempt whose handler cannot start (it cannot be exec'd, say) is
an attempt (counted, retried or dead-lettered by the queue's policy, ``Admission.cannot_start``),
and jobd's span of it (``process QUEUE``, started by ``Handler.spawn``'s ``attempt_environment``
before the start) is never ended, so never exported: the producer's trace shows the wait in the
queue and nothing of the attempt that failed, nor its error (a job dead-lettered at its first
start shows no failure at all: seen here, outcome dead-letter, error "spawn"). The span is
ended only in ``Endings.decided`` (``Admission.ended``, ``tracing.ended``), since 8438e97 at
the exit seen; every other way an attempt ends misses it: ``Admission.cannot_start`` (a start
that raised, the Popen path of ``run_as``/``cwd``; and ``Handler.start_error`` once reaped, the
clone path), and the releases of ``Endings`` (an internal error, the follow-ups thread that
cannot start).

Reproduced with a daemon in this process (``test_loop.Loop``), the entry carrying a producer's
traceparent, jobd's spans an in-process stand-in for ``tracing.Spans`` that records what is
started and ended (the SDK is not needed to see that ``end`` is never called): a queue whose
handler cannot be exec'd (a script whose interpreter is missing: ENOENT, as a command deleted
by a deploy after the config was read), by both start paths (the clone, the daemon not waiting
for its exec; Popen, with a ``cwd`` of its own), and, for comparison, one whose handler runs
(its span ended).

Fixed (jobd/daemon/admission.py, endings.py, process/handler.py, states.py): every way an
attempt ends settles it through one place, ``Admission.ended``, which ends its span with the
outcome: decided, ``cannot_start`` and ``lapsed`` (given the handler's span, or, for a start
that raised, the span its error carries: ``states.unstarted``), and ``Endings.released`` (an
internal error, the follow-ups thread that cannot start). The second test covers those
releases and a start that raised something else than an OSError (a ``run_as`` user deleted)."""

from __future__ import annotations

import os
import pwd
import threading
from typing import Any

import pytest
import redis
from support import wait_group
from test_endings_faults import opened  # noqa: F401  (a fixture)
from test_loop import STREAM, Loop

from jobd import tracing
from jobd.outcome import Verb
from jobd.process import policy

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Spans:
    """``tracing.Spans`` as the daemon uses it: what was started and what ended, and how."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.ended: dict[str, str] = {}

    def start(self, job: Any, queue: Any) -> tuple[Any, str]:
        self.started.append(job.job_id)
        return job.job_id, PARENT

    def end(self, span: Any, outcome: Any, end_time: int | None = None) -> None:
        self.ended[span] = outcome.verb.name

    def shutdown(self) -> None:
        pass


@pytest.mark.parametrize(
    ("interpreter", "extra"),
    [
        ("/bin/sh", ""),  # runs: its span ended (the comparison)
        ("/nonexistent/interpreter", ""),  # the clone path: ``start_error`` once reaped
        ("/nonexistent/interpreter", ", cwd: /"),  # Popen: SpawnError at the start
    ],
    ids=["runs", "clone-cannot-exec", "popen-cannot-exec"],
)
def test_an_attempt_that_cannot_start_ends_its_span(
    r: redis.Redis,
    write_config,
    script,
    opened: list[Loop],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    interpreter: str,
    extra: str,
) -> None:
    spans = Spans()
    monkeypatch.setattr(tracing, "_spans", spans)
    handler = script("h", f"#!{interpreter}\nexit 0\n")
    cfg = write_config(
        "redis: {url: '{redis}'}\nshutdown_grace: 200ms\nqueues:\n"
        f"  q: {{stream: {STREAM}, command: [{handler}], retry: {{max_attempts: 1}}{extra}}}\n"
    )
    loop = Loop(cfg)
    opened.append(loop)
    wait_group(r, STREAM)
    r.xadd(STREAM, {"payload": "x", "job_id": "j1", "traceparent": PARENT})
    outcome = loop.outcome()
    assert spans.started == ["j1"], spans.started  # the attempt's span was started
    print(
        f"{interpreter}{extra}: outcome {outcome.verb.name} ({outcome.error}); ended {spans.ended}"
    )
    assert "j1" in spans.ended, (
        f"the attempt ended ({outcome.verb.name}: {outcome.error}) and its span never did"
    )
    assert spans.ended["j1"] == outcome.verb.name


WRITE = """#!/bin/sh
printf '{"queue": "q2", "payload": "next"}\\n' > "$JOBD_ENQUEUE"
"""


@pytest.mark.parametrize("fault", ["deciding", "follow-ups-thread", "run-as-user-gone"])
def test_an_attempt_released_or_failed_by_jobd_ends_its_span(
    r: redis.Redis,
    write_config,
    script,
    opened: list[Loop],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    fault: str,
) -> None:
    """The other ways an attempt ends: ``Endings.release`` (an error deciding its outcome), the
    follow-ups thread that cannot start (released, its file removed), and a start that raised
    something else than an OSError (its ``run_as`` user deleted since the config was read)."""
    if fault == "run-as-user-gone" and os.geteuid() != 0:
        pytest.skip("handlers of another user: root")
    spans = Spans()
    monkeypatch.setattr(tracing, "_spans", spans)
    extra = ", run_as: {user: nobody}" if fault == "run-as-user-gone" else ""
    cfg = write_config(
        "redis: {url: '{redis}'}\nshutdown_grace: 200ms\nqueues:\n"
        f"  q: {{stream: {STREAM}, command: [{script('write.sh', WRITE)}],"
        f" retry: {{max_attempts: 1}}{extra}}}\n"
        "  q2: {stream: 'jobd:q2', command: [/bin/true]}\n"
    )
    loop = Loop(cfg)
    opened.append(loop)
    wait_group(r, STREAM)
    if fault == "deciding":
        monkeypatch.setattr(policy, "of_handler", lambda *args, **kwargs: 1 / 0)
    elif fault == "follow-ups-thread":
        real = threading.Thread.start

        def start(self: threading.Thread) -> None:  # a task limit
            if self.name == "jobd-follow-ups":
                raise RuntimeError("can't start new thread")
            real(self)

        monkeypatch.setattr(threading.Thread, "start", start)
    else:
        real_getpwnam = pwd.getpwnam

        def getpwnam(name: str) -> pwd.struct_passwd:
            if name == "nobody":
                raise KeyError(f"getpwnam(): name not found: {name!r}")
            return real_getpwnam(name)

        monkeypatch.setattr(pwd, "getpwnam", getpwnam)
    r.xadd(STREAM, {"payload": "x", "job_id": "j1", "traceparent": PARENT})
    outcome = loop.outcome()
    assert spans.started == ["j1"], spans.started
    want = Verb.DEAD_LETTER if fault == "run-as-user-gone" else Verb.RELEASE
    assert outcome.verb is want, (outcome.verb, outcome.error)
    assert spans.ended == {"j1": want.name}, spans.ended
