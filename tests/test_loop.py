"""The loop in-process: a real Daemon object against the session's private Redis, with real
handler processes, driven pass by pass (``open``, ``step``, ``close``) with no daemon
subprocess, so a test can watch the internal transitions: a handler's state and stop reason,
and the outcome the policy decided, as the recorder receives it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from support import DEADLINE, pending_count, wait_group

from jobd.config import load
from jobd.daemon.lease import Lost, key
from jobd.daemon.loop import Daemon
from jobd.outcome import MALFORMED, TIMEOUT, Outcome, Verb
from jobd.process.handler import Handler, State, StopReason

STREAM = "jobd:q"


class Loop:
    """A Daemon opened in this process; every outcome the loop settles is kept."""

    def __init__(self, config_path: Path) -> None:
        self.daemon = Daemon(load(str(config_path)))
        self.outcomes: list[Outcome] = []
        settle = self.daemon.settle

        def spy(outcome: Outcome) -> None:
            self.outcomes.append(outcome)
            settle(outcome)

        self.daemon.settle = spy  # type: ignore[method-assign]
        self.daemon.open()

    def until(self, predicate: Callable[[], object], what: str) -> None:
        """Run passes until ``predicate`` holds; fail past the deadline."""
        deadline = time.monotonic() + DEADLINE
        while not predicate():
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for {what}")
            self.daemon.step()

    def handler(self) -> Handler:
        self.until(lambda: len(self.daemon.running) == 1, "a handler to start")
        return next(iter(self.daemon.running))

    def outcome(self) -> Outcome:
        self.until(lambda: self.outcomes, "an outcome")
        return self.outcomes[0]

    def stop(self) -> None:
        if not self.daemon.stopping:
            self.daemon.begin_stop("the test's end")
        self.until(self.daemon.finished, "the loop to finish")
        self.daemon.close()


def started(
    r: redis.Redis, write_config, opened: list[Loop], command: str, **settings: str
) -> Loop:
    """A Loop of one queue ``q`` on STREAM running ``command`` (a YAML list), with ``settings``
    (YAML values by name), once its group is made; kept in ``opened``, for the test to stop."""
    extra = "".join(f"\n    {name}: {value}" for name, value in settings.items())
    path = write_config(
        "redis: {url: '{redis}'}\nshutdown_grace: 200ms\n"
        f"queues:\n  q:\n    stream: {STREAM}\n    command: {command}{extra}\n"
    )
    opened.append(Loop(path))
    wait_group(r, STREAM)
    return opened[-1]


@pytest.fixture
def loop(r: redis.Redis, write_config) -> Iterator[Callable[..., Loop]]:
    opened: list[Loop] = []
    yield lambda command, **settings: started(r, write_config, opened, command, **settings)
    for each in opened:
        each.stop()


def test_a_job_runs_and_is_acked(r: redis.Redis, loop, tmp_path: Path) -> None:
    out = tmp_path / "out"
    lp = loop(f"[/bin/sh, -c, 'cat > {out}']")
    r.xadd(STREAM, {"payload": "hello", "job_id": "j1"})
    handler = lp.handler()
    assert handler.state is State.RUNNING and handler.job.job_id == "j1"
    outcome = lp.outcome()
    assert handler.state is State.EXITED and handler.stop_reason is None
    assert (outcome.verb, outcome.job.job_id, outcome.error) == (Verb.ACK, "j1", None)
    assert outcome.timing is not None and outcome.timing[1] >= 0
    assert out.read_bytes() == b"hello"
    lp.until(lambda: pending_count(r, STREAM) == 0, "the ack")


def test_a_timeout_is_sigterm_then_sigkill_then_a_retry(r: redis.Redis, loop) -> None:
    lp = loop("[/bin/sh, -c, 'trap \"\" TERM; sleep 30']", timeout="300ms", kill_grace="300ms")
    r.xadd(STREAM, {"payload": "x"})
    handler = lp.handler()
    lp.until(lambda: handler.state is State.TERMINATING, "the timeout's SIGTERM")
    assert handler.stop_reason is StopReason.TIMEOUT
    assert handler.due != float("inf"), "SIGKILL is due after kill_grace"
    outcome = lp.outcome()
    assert time.monotonic() - handler.started >= 0.6, "SIGTERM was ignored: SIGKILL ended it"
    assert (outcome.verb, outcome.error, outcome.signal) == (Verb.RETRY, TIMEOUT, None)
    assert handler.status is not None and handler.status.signal == 9 and handler.status.timed_out


def test_a_lost_lease_stops_the_handler_and_records_nothing(r: redis.Redis, loop) -> None:
    lp = loop("[/bin/sleep, '30']")
    mid = r.xadd(STREAM, {"payload": "x"}).decode()
    handler = lp.handler()
    q = handler.queue
    lp.daemon.inbox.report_lost([Lost(key(q), mid, "someone-else")])
    outcome = lp.outcome()
    assert handler.stop_reason is StopReason.LEASE_LOST and handler.lease_lost
    assert outcome.verb is Verb.RELEASE
    assert mid not in lp.daemon.holdings.snapshot(key(q)), "forgotten when settled"
    assert pending_count(r, STREAM) == 1, "the entry is the new owner's to settle"


def test_shutdown_hands_a_running_job_back(r: redis.Redis, loop) -> None:
    lp = loop("[/bin/sleep, '30']")
    r.xadd(STREAM, {"payload": "x"})
    handler = lp.handler()
    lp.daemon.begin_stop("test")
    outcome = lp.outcome()
    assert handler.stop_reason is StopReason.SHUTDOWN
    assert outcome.verb is Verb.HAND_BACK
    lp.until(lp.daemon.finished, "the loop to finish")


def test_a_payload_above_max_payload_is_dead_lettered_unrun(r: redis.Redis, loop) -> None:
    lp = loop("[/bin/true]", max_payload="8")
    r.xadd(STREAM, {"payload": "x" * 9, "job_id": "big"})
    outcome = lp.outcome()
    assert (outcome.verb, outcome.error, outcome.job.job_id) == (Verb.DEAD_LETTER, MALFORMED, "big")
    assert b"above max_payload" in outcome.detail
    assert lp.daemon.metrics.of("q").started._value.get() == 0, "no handler started"
    lp.until(lambda: r.xlen("{jobd:q}:dead") == 1, "the dead letter")
