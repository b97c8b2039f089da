"""Review 34l's suspicions about a handler's end decided once its JOBD_ENQUEUE file is parsed on a
thread (``daemon.endings``), tested in-process (a Daemon whose passes the test runs, a private
Redis, real handlers):

(a) an exception while deciding such an end (``Endings.take``, after ``pending -= 1``) left the
end unsettled for good (its entry held and renewed for ever, its slot never freed) and the ends
parsed behind it in the deque until the thread's next byte;
(b) the job's lease lost while its file is parsed (another daemon took the entry over, as its
reclaim does past reclaim_after): the outcome, decided afterwards, must change nothing of the
new owner's (settle.lua's ownership check: no ack, no follow-ups written)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from support import DEADLINE
from test_loop import STREAM, Loop

from jobd.daemon import lease
from jobd.outcome import Verb
from jobd.process import policy

LINE = json.dumps({"queue": "sink", "payload": "x"})


def until(loop: Loop, predicate: Callable[[], object], what: str) -> list[str]:
    """Passes until ``predicate`` holds, as ``Daemon.run`` runs them (an exception is logged
    and the loop goes on); the exceptions seen."""
    errors: list[str] = []
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what} (errors in passes: {errors})")
        try:
            loop.daemon.step()
        except Exception as exc:
            errors.append(repr(exc))
    return errors


@pytest.fixture
def opened() -> Iterator[list[Loop]]:
    loops: list[Loop] = []
    yield loops
    for loop in loops:
        loop.stop()


def test_an_error_deciding_a_parsed_end_loses_neither_it_nor_the_ends_behind_it(
    r: redis.Redis, write_config, opened: list[Loop], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = policy.of_handler
    raised: list[str] = []

    def of_handler(handler, *args, **kwargs):  # a bug, once, deciding job "bad"
        if handler.job.job_id == "bad" and not raised:
            raised.append(handler.job.job_id)
            raise RuntimeError("a bug deciding it")
        return real(handler, *args, **kwargs)

    monkeypatch.setattr(policy, "of_handler", of_handler)
    cfg = write_config(
        "redis: {url: '{redis}'}\nshutdown_grace: 10s\nqueues:\n"
        f"  q:\n    stream: {STREAM}\n    concurrency: 2\n    command: [/bin/sh, -c, "
        f"'echo {json.dumps(LINE)} > \"$JOBD_ENQUEUE\"']\n"
        "  sink:\n    command: [/bin/true]\n"
    )
    loop = Loop(cfg)
    opened.append(loop)
    endings = loop.daemon.endings
    # Both ends parsed before one ``take`` decides them: the loop's takes are held until then
    # (its passes go on), bad's first in the deque.
    held, take = [True], endings.take
    monkeypatch.setattr(endings, "take", lambda: None if held[0] else take())
    r.xadd(STREAM, {"payload": "", "job_id": "bad"})
    until(loop, lambda: len(endings.parsed) == 1, "bad's file parsed")
    r.xadd(STREAM, {"payload": "", "job_id": "good"})
    until(loop, lambda: len(endings.parsed) == 2, "good's file parsed")
    assert [e[0].job.job_id for e, _ in endings.parsed] == ["bad", "good"]
    held[0] = False
    errors = until(
        loop, lambda: {o.job.job_id for o in loop.outcomes} >= {"bad", "good"}, "the ends decided"
    )
    decided = {o.job.job_id: o.verb for o in loop.outcomes}
    assert raised == ["bad"], "inconclusive: the fault was not injected"
    assert decided.get("good") is Verb.ACK, f"the end behind the failed one: {decided} {errors}"
    assert "bad" in decided, f"the end whose decision failed was never settled: {errors}"
    assert decided["bad"] is Verb.RELEASE, decided  # run again, as for an error in its reap
    assert endings.pending == 0


def test_a_lease_lost_while_the_file_is_parsed_changes_nothing_of_the_new_owners(
    r: redis.Redis, write_config, opened: list[Loop], caplog: pytest.LogCaptureFixture
) -> None:
    cfg = write_config(
        "redis: {url: '{redis}'}\nshutdown_grace: 10s\nqueues:\n"
        f"  q:\n    stream: {STREAM}\n    command: [/bin/sh, -c, "
        f"'echo {json.dumps(LINE)} > \"$JOBD_ENQUEUE\"']\n"
        "  sink:\n    command: [/bin/true]\n"
    )
    recorder = logging.getLogger("jobd.recorder")
    recorder.addHandler(caplog.handler)  # the daemon's loggers may not propagate
    try:
        loop = Loop(cfg)
        opened.append(loop)
        mid = r.xadd(STREAM, {"payload": "", "job_id": "parent"}).decode()
        until(loop, lambda: loop.daemon.endings.pending, "the parent's end waiting for its file")
        # Its file parsed or not, it is decided only at a pass of the loop, which the test
        # holds: meanwhile another daemon takes the entry over (its reclaim, past
        # reclaim_after, of a daemon that was stopped).
        r.xclaim(STREAM, "jobd", "another-daemon", 0, [mid])
        queue = loop.daemon.config.queues["q"]
        # its renewal finds the lease lost
        until(loop, lambda: not loop.daemon.holdings.holds(lease.key(queue), mid), "the loss")
        until(loop, lambda: loop.outcomes, "the parent decided")
        assert loop.outcomes[0].verb is Verb.ACK and loop.outcomes[0].follow_ups
        until(loop, lambda: "outcome not recorded" in caplog.text or not pending(r, mid),
              "the recorder's write")  # fmt: skip
    finally:
        recorder.removeHandler(caplog.handler)
    assert pending(r, mid) == "another-daemon", "the new owner's entry was settled from here"
    sink = loop.daemon.config.queues["sink"].stream
    assert r.xlen(sink) == 0, "the parent's follow-ups were written by a daemon that lost it"


def pending(r: redis.Redis, mid: str) -> str | None:
    """The consumer that holds entry ``mid`` of the queue's stream, or None."""
    found = r.xpending_range(STREAM, "jobd", mid, mid, 1)
    return found[0]["consumer"].decode() if found else None
