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

What should happen: each attempt's span ends with the attempt's outcome (``jobd.outcome``
failed/dead, its error), whatever way the attempt ended; e.g. ``tracing.ended`` from
``cannot_start`` (the handler's span passed along, or ended where ``SpawnError`` is raised /
``start_error`` found) and from ``Endings.release``."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from support import wait_group
from test_endings_faults import opened  # noqa: F401  (a fixture)
from test_loop import STREAM, Loop

from jobd import tracing

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
