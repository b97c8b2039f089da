"""Review 34p of issue 34: a start that fails making its pipes leaks the pipes made before.

``Handler.spawn`` makes three pipes in a row (stdout, stderr, stdin for a payload) with
``os.pipe2``, and writes a small payload ahead, before the ``try`` around ``launch.start``
that closes them on a failure (8fd0b8c widened that ``try`` to every exception, not to these
lines). When the second or third ``pipe2`` fails (EMFILE/ENFILE: a daemon at its descriptor
limit), the pipes already made are never closed: two or four descriptors lost at each such
start, for the daemon's life. The job is retried (``Admission.cannot_start``), and each retry
at the limit loses more: the daemon stays at its limit (its channel's spares, its Redis
connections, every handler after fail the same way) where it would have recovered once the
pressure went.

Reproduced with a daemon in this process (``test_loop.Loop``), ``os.pipe2`` in
``jobd.process.handler`` failing with EMFILE at its second call (the stderr pipe) of the
first start; the first pipe's two descriptors are looked at in /proc/self/fd once the attempt
is settled.

Should: both closed (the same pipe no longer open in the daemon). Suggested fix: make the
pipes inside the ``try`` that closes what was made (or close what was made before raising),
the span attached to the error as for any failed start (test_review34p_pipe_failure_span).

Fixed (jobd/process/handler.py): the pipes are made by ``_pipes``, which closes those it made
when one cannot be made, before the error goes on.
"""

from __future__ import annotations

import errno
import os
from typing import Any

import pytest
import redis
from test_endings_faults import opened  # noqa: F401  (a fixture)
from test_loop import STREAM, Loop, started

from jobd.outcome import Verb
from jobd.process import handler as handler_module


class Os:
    """``os`` for ``jobd.process.handler``: its second ``pipe2`` fails with EMFILE, once; the
    first one's descriptors and what /proc/self/fd says of them are kept."""

    def __init__(self) -> None:
        self.calls = 0
        self.first: list[tuple[int, str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def pipe2(self, flags: int) -> tuple[int, int]:
        self.calls += 1
        if self.calls == 2:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        made = os.pipe2(flags)
        if self.calls == 1:
            self.first = [(fd, os.readlink(f"/proc/self/fd/{fd}")) for fd in made]
        return made


def still_open(fd: int, link: str) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == link
    except FileNotFoundError:
        return False


def test_a_start_that_cannot_make_its_pipes_closes_those_it_made(
    r: redis.Redis,
    write_config,
    opened: list[Loop],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = started(r, write_config, opened, "[/bin/true]", retry="{max_attempts: 3}")
    fake = Os()
    monkeypatch.setattr(handler_module, "os", fake)
    r.xadd(STREAM, {"payload": "x", "job_id": "j1"})
    outcome = loop.outcome()
    monkeypatch.undo()  # the next starts as they are
    assert fake.calls >= 2 and fake.first, "inconclusive: the fault was not injected"
    assert outcome.verb is Verb.RETRY, (outcome.verb, outcome.error)
    leaked = [fd for fd, link in fake.first if still_open(fd, link)]
    assert not leaked, f"the stdout pipe of a start that failed is still open: {fake.first}"
