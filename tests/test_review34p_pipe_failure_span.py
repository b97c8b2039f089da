"""Review 34p of issue 34: a start that fails making its pipes leaves its span open.

8fd0b8c: "a failed start's error carries its span" (``states.unstarted``), so that
``Admission.start`` ends it with the attempt's outcome (``cannot_start``, ``span_of``). Only an
error of ``launch.start`` carries it: ``Handler.spawn`` starts the span first
(``attempt_environment`` -> ``tracing.attempt``) and then makes the handler's pipes
(``os.pipe2``, three of them) and writes a small payload ahead (``os.write``) outside the
``try`` that attaches the span. An OSError there (EMFILE/ENFILE: a daemon at its descriptor
limit, the case the channel's spares are kept for) reaches ``Admission.start`` without a span:
the attempt is counted and retried (``cannot_start``), its span, started, is never ended, so
never exported.

Reproduced with a daemon in this process (``test_loop.Loop``), the entry carrying a
producer's traceparent, ``os.pipe2`` in ``jobd.process.handler`` failing with EMFILE at its
second call of the first start (the stderr pipe), jobd's spans a stand-in recording what
started and ended (as tests/test_review34o_span_start_failure.py does).

Should: the attempt's span ends with its outcome (retry), as for any start that fails.
Suggested fix: start the span after the pipes (just before ``launch.start``), or widen the
``try`` that attaches it (``states.unstarted``) to everything after ``attempt_environment``.

Fixed (jobd/process/handler.py, launch.py): the ``try`` that attaches the span covers
everything after ``attempt_environment``: the pipes (``_pipes``), the payload written ahead and
the start (``launch.piped``, which closes the pipes' ends, ours too when it fails).
"""

from __future__ import annotations

import pytest
import redis
from test_endings_faults import opened  # noqa: F401  (a fixture)
from test_loop import STREAM, Loop, started
from test_review34o_span_start_failure import PARENT, Spans
from test_review34p_pipe_failure_fds import Os

from jobd import tracing
from jobd.outcome import Verb
from jobd.process import handler as handler_module


def test_a_start_that_cannot_make_its_pipes_ends_its_span(
    r: redis.Redis,
    write_config,
    opened: list[Loop],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spans = Spans()
    monkeypatch.setattr(tracing, "_spans", spans)
    loop = started(r, write_config, opened, "[/bin/true]", retry="{max_attempts: 3}")
    fake = Os()
    monkeypatch.setattr(handler_module, "os", fake)
    r.xadd(STREAM, {"payload": "x", "job_id": "j1", "traceparent": PARENT})
    outcome = loop.outcome()
    assert fake.calls >= 2, "inconclusive: the fault was not injected"
    assert outcome.verb is Verb.RETRY, (outcome.verb, outcome.error)
    assert spans.started == ["j1"], spans.started  # the attempt's span was started
    assert spans.ended == {"j1": "RETRY"}, (
        f"the attempt failed to start ({outcome.error}) and its span never ended: {spans.ended}"
    )
