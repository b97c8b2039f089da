"""Review 34m (issue 34, a handler that exited waits in ``Handlers.leaving`` until the channel's
thread has read past its exit, LEAVE_WAIT at most): the wait is counted as the handler's run
time. ``Endings.finish`` takes ``took = time.monotonic() - handler.started`` when the handler
leaves the table, not when its leader exited (``Daemon.step``: ``exited`` then, ``left``
up to a second later), so the attempt's duration everywhere it is shown includes the wait:
the history record's ``seconds`` (``Ran``), ``jobd_job_duration_seconds``
(``Endings.decided``), the log line "exit 0 after …s", and the queue's pace (``prefetch``'s
average, ``Admission.ended``). A handler that ran 0.1 s under a channel whose thread is stuck
(the case docs/handlers-talking-back.md names: "a wait ran out with the thread reading nothing")
is recorded as having run over a second; under a stranger's flood at
``net.unix.max_dgram_qlen`` 512 every end adds the thread's time to judge 577 messages (the
docs measure 25–36 ms a median end, 0.1 s at most: several times a short job's run).

Fixed: the loop notes when it saw a handler's exit (``Handlers.exited``: ``Handler.exit_seen``),
and its run is measured to then.

In-process (a Daemon whose passes the test runs, a private Redis, a real Python handler sending
its last message on a raw socket, the issue's way): the channel's thread held in its read (a
stand-in for a stuck thread) while the handler sends and exits. What the handler ran is
measured from its start to the pass that saw its exit (its pidfd)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
import redis
from support import DEADLINE, wait_group
from test_endings_faults import opened  # noqa: F401  (a fixture)
from test_loop import STREAM, Loop

from jobd.daemon.channel import LEAVE_WAIT

LAST = """#!{python}
import os, socket
address = os.environ["NOTIFY_SOCKET"]
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
    s.sendto(b"STATUS=last\\nX_JOBD_RESULT=ok", "\\0" + address[1:])
"""


def test_the_wait_for_the_channel_is_not_counted_as_the_handlers_run(
    r: redis.Redis,
    write_config,
    opened: list[Loop],  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    last = tmp_path / "last.py"
    last.write_text(LAST.format(python=sys.executable))
    last.chmod(0o755)
    cfg = write_config(
        "redis: {url: '{redis}'}\nshutdown_grace: 10s\nqueues:\n"
        f"  q:\n    stream: {STREAM}\n    command: [{last}]\n"
    )
    loop = Loop(cfg)
    opened.append(loop)
    wait_group(r, STREAM)
    daemon, channel = loop.daemon, loop.daemon.running.channel
    gate, reading = threading.Event(), threading.Event()
    real = channel.receiver.batch

    def batch(*args, **kwargs):  # the thread stuck in its next read, until the test's end
        reading.set()
        gate.wait()
        return real(*args, **kwargs)

    monkeypatch.setattr(channel.receiver, "batch", batch)
    channel.asked.wake()
    assert reading.wait(DEADLINE), "the channel's thread did not read"
    try:
        r.xadd(STREAM, {"payload": "", "job_id": "a"})
        deadline = time.monotonic() + DEADLINE
        started = exited = None
        while not loop.outcomes:
            assert time.monotonic() < deadline, "no outcome"
            daemon.step()
            if started is None and len(daemon.running):
                started = next(iter(daemon.running)).started
            if exited is None and daemon.running.leaving:
                exited = time.monotonic()  # the pass that saw its exit: no later than this
    finally:
        gate.set()
    assert started is not None and exited is not None
    ran = loop.outcomes[0].ran
    assert ran is not None
    assert ran.seconds <= exited - started + 0.1, (
        f"the handler ran {exited - started:.3f}s (its start to the pass that saw its exit); "
        f"its attempt is recorded as {ran.seconds:.3f}s: the wait for the channel's thread "
        f"(LEAVE_WAIT {LEAVE_WAIT}s) counted as its run"
    )
