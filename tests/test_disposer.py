"""The disposer of the descriptors messages on the handlers' channel bring (``daemon.disposer``):
it sends them to a sink process, which closes them, and replaces a sink that is stuck. Real
sink processes, no daemon (the channel's own tests, test_review34c_*, go through a daemon)."""

from __future__ import annotations

import json
import logging
import os
import resource
import select
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import redis
from support import DaemonProcess, acked_all, queue_config, wait_until

from jobd.daemon import disposer

ROOT = Path(__file__).resolve().parent.parent


def closed(read_end: int) -> bool:
    """Whether every copy of the pipe's write end is closed (end of file on ``read_end``)."""
    return bool(select.select([read_end], [], [], 0)[0]) and os.read(read_end, 1) == b""


def stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (none can take a message any more)."""
    states = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            states.append(f.read().rsplit(")", 1)[1].split()[0])
    return all(state == "T" for state in states)


def test_a_pipe_given_is_closed_by_the_sink_not_by_the_daemon() -> None:
    """The write end given is closed everywhere soon (what `jobd notify` waits for), its last
    copy by the sink, a process of its own with nothing of the daemon's."""
    d = disposer.Disposer()
    read_end, write_end = os.pipe()
    try:
        d.give([write_end])
        wait_until(lambda: closed(read_end), timeout=10, what="the write end closed")
        assert d.sink is not None and d.sink.proc.poll() is None
        sink = d.sink.proc.pid
        with open(f"/proc/{sink}/cmdline", "rb") as f:
            assert f.read().split(b"\0")[2:4] == [b"-S", disposer.SINK[3].encode()]
        with open(f"/proc/{sink}/environ", "rb") as f:
            assert f.read() == b""
        assert d.pending == 0
    finally:
        d.close()
        os.close(read_end)
    wait_until(lambda: not os.path.exists(f"/proc/{sink}"), what="the sink gone with its daemon")


def test_a_stuck_sink_is_killed_and_replaced(caplog: pytest.LogCaptureFixture) -> None:
    """A sink that stops reading (stopped here; stuck in closes in life) and more than its queue
    holds given: after STUCK_AFTER the disposer kills it, starts another, and everything given
    is closed (what waited in the daemon, and what the old one left unread, taken back)."""
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 8192:
        pytest.skip("needs 8192 open files")
    caplog.set_level(logging.WARNING, "jobd.daemon")
    d = disposer.Disposer()
    read_end, write_end = os.pipe()
    try:
        d.give([os.dup(write_end)])
        wait_until(lambda: d.sink is not None and d.pending == 0, what="the first sink")
        assert d.sink is not None
        first = d.sink.proc.pid
        os.kill(first, signal.SIGSTOP)
        wait_until(lambda: stopped(first), what="every thread of the sink stopped")
        for _ in range(20):  # more messages than its queue holds (200 + 200: never one)
            d.give([os.dup(write_end) for _ in range(200)])
        os.close(write_end)
        wait_until(lambda: closed(read_end), timeout=20, what="every copy closed")
        assert d.sink is not None and d.sink.proc.pid != first
        wait_until(lambda: not d.abandoned, timeout=10, what="the stuck sink reaped")
        assert not os.path.exists(f"/proc/{first}")
        assert "is stuck in a close" in caplog.text
    finally:
        d.close()
        os.close(read_end)


def test_a_sink_that_stops_reading_is_replaced_before_its_queue_is_full() -> None:
    """One message waits in a sink that reads no more (every thread of its blocked in a close,
    in life; stopped here): its queue is far from full, yet after STUCK_AFTER with nothing read
    the disposer kills it, takes the message back, and a new sink closes the pipe end in it
    (`jobd notify` waits for that, 5 s at most)."""
    d = disposer.Disposer()
    read_end, write_end = os.pipe()
    try:
        first_r, first_w = os.pipe()
        d.give([first_w])
        wait_until(lambda: closed(first_r), what="the first sink at work")
        os.close(first_r)
        assert d.sink is not None
        first = d.sink.proc.pid
        os.kill(first, signal.SIGSTOP)
        wait_until(lambda: stopped(first), what="every thread of the sink stopped")
        d.give([write_end])
        wait_until(lambda: closed(read_end), timeout=10, what="the pipe end closed by another")
        assert d.sink is not None and d.sink.proc.pid != first
    finally:
        d.close()
        os.close(read_end)


def test_the_sink_is_started_by_jobd_notify_and_dies_with_its_daemon(
    r: redis.Redis, write_config, script, daemon: Callable[..., DaemonProcess]
) -> None:
    """A daemon's first message with a descriptor (`jobd notify`'s pipe) starts its sink, a
    child named jobd-sink, which the daemon's reaper leaves alone; the daemon killed (SIGKILL:
    nothing of its own runs), the sink goes too (PR_SET_PDEATHSIG)."""
    script("h.sh", f"#!/bin/sh\nexec {sys.executable} -m jobd notify --status 'all fine'\n")
    env = json.dumps({"PYTHONPATH": str(ROOT)})
    d = daemon(write_config(queue_config("[./h.sh]", env=env, retry="{max_attempts: 1}")))
    r.xadd("jobd:q", {"payload": "", "job_id": "j"})
    wait_until(lambda: acked_all(r, "jobd:q", 1), what="the job done")
    assert "job=j attempt=1 exit 0" in d.log()
    [sink] = [p for p in psutil.Process(d.proc.pid).children() if p.name() == "jobd-sink"]
    # No handler runs now: the reaper's sweeps (every 0.25 s) end a child of no job, and the
    # sink is none of theirs: it is still there a second (four sweeps) later.
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        assert sink.is_running() and sink.status() != psutil.STATUS_ZOMBIE, d.log()[-2000:]
        time.sleep(0.05)
    assert "outlived it; killed" not in d.log()
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait()
    wait_until(lambda: not sink.is_running() or sink.status() == psutil.STATUS_ZOMBIE,
               what="the sink gone with its daemon")  # fmt: skip
