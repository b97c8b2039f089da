"""Review 34n: ``Endings.finish``'s guard (review 34m) releases a handler whose end raised, but
when what raised is the start of the follow-ups thread (``Endings.ended``: ``self.thread`` is
set to the new Thread before ``start()``; "can't start new thread" at a unit's TasksMax or
RLIMIT_NPROC, which the handlers' own processes count against), the Thread object stays, never
started, and its ending stays in ``asked`` too (``pending`` one more). Every later handler that
writes a follow-up file (``JOBD_ENQUEUE``) is put in ``asked`` for a thread that never runs:
never decided, never settled; its entry held and its lease renewed for good, its slot never
freed. The released job's own next attempt is one of them.

Fixed: the thread is kept only once started; an end whose thread cannot start is released (its
file removed), never asked, and the next file's end starts the thread again. The released entry
runs again once reclaimed (``lease.reclaim_after``, short here).

In-process (a Daemon whose passes the test runs, a private Redis, real sh handlers); the thread
start fails once (as it does at a task limit), then works again."""

from __future__ import annotations

import threading

import pytest
import redis
from support import wait_group
from test_endings_faults import opened, until  # noqa: F401  (a fixture)
from test_loop import STREAM, Loop

from jobd.outcome import Verb

WRITE = """#!/bin/sh
printf '{"queue": "q2", "payload": "next"}\\n' > "$JOBD_ENQUEUE"
"""


def test_a_follow_ups_thread_that_failed_to_start_once_leaves_no_job_unsettled(
    r: redis.Redis,
    write_config,
    script,
    opened: list[Loop],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = write_config(
        "redis: {url: '{redis}'}\nshutdown_grace: 200ms\nqueues:\n"
        f"  q:\n    stream: {STREAM}\n    command: [{script('write.sh', WRITE)}]\n"
        "    lease: {renew_every: 300ms, reclaim_after: 1s}\n"  # the released entry: reclaimed
        "  q2:\n    stream: jobd:q2\n    command: [/bin/true]\n"
    )
    real, failed = threading.Thread.start, []

    def start(self: threading.Thread) -> None:  # a task limit, once
        if self.name == "jobd-follow-ups" and not failed:
            failed.append(self.name)
            raise RuntimeError("can't start new thread")
        real(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    loop = Loop(cfg)
    opened.append(loop)
    wait_group(r, STREAM)
    r.xadd(STREAM, {"payload": "x", "job_id": "j1"})
    until(loop, lambda: failed, "the thread's start failing")
    until(loop, lambda: loop.outcomes, "the first attempt's outcome")
    assert loop.outcomes[0].verb is Verb.RELEASE  # the guard: released, to run again
    r.xadd(STREAM, {"payload": "y", "job_id": "j2"})  # a later job, the task limit gone
    endings = loop.daemon.endings
    try:
        until(
            loop,
            lambda: {o.job.job_id for o in loop.outcomes if o.verb is Verb.ACK} >= {"j1", "j2"},
            "j1's next attempt and j2 acked with their follow-ups",
        )
    finally:
        alive = endings.thread is not None and endings.thread.is_alive()
        print(f"follow-ups thread alive: {alive}, pending ends: {endings.pending}")
        print([(o.verb, o.job.job_id) for o in loop.outcomes])
        if not alive and endings.thread is not None:  # so that the fixture's stop can end
            endings.thread = None
            while not endings.asked.empty():
                ending = endings.asked.get()
                endings.pending -= 1
                endings.decide(ending, ((), None))
