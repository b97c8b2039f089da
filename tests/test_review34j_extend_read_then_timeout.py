"""Review of issue 34 (handlers talk back), round 34j: a handler that asked for more time before
its deadline, and was told its message was read (the pipe `jobd notify` waits on closed, as
docs/handlers-talking-back.md promises: "sends one message and returns once jobd has read it"),
is stopped at that deadline as a timeout all the same when the loop was busy meanwhile.

What is wrong: the channel's thread reads the request and queues it for the loop (before it
closes the sender's pipe: daemon/channel.py take_one), but the loop takes what is queued only
when its poll reports the channel's byte (daemon/loop.py step: `elif what == "channel"`). A
pass that began before the request (here: another handler's end, whose JOBD_ENQUEUE of 10 000
lines costs the loop a second to parse in finish -> policy.of_handler -> followups.collected)
goes on to `act_on_due` -> Handlers.act -> Handler.act (jobd/process/handler.py: `if self.due
<= now` ... `self.stop(... StopReason.TIMEOUT ...)`) with the request still in the queue, not
heard: `due` is still start + timeout. A watchdog is not stopped that way (it waits until the
channel was heard out past its due time: Handler.act's `heard`); the timeout has no such
guard, and nothing takes the queue before the stop.

What should happen: a request read before the deadline counts: the handler runs on (here 5 s
more, under a max_timeout of 20 s) and is done. Suggested fix: `act_on_due` (or Handlers.act,
before stopping anything for its timeout) first takes what the channel queued
(`self.hear(now)`: a fixed cost, only when something is due) — as `Handlers.sync` does before
exits; a flood cannot use it to put a timeout off, since only what was queued is taken.

Real daemon, real handlers (Python, sending as `jobd notify` does: the message with one end
of a pipe, then waiting for the pipe's end), a private Redis. The victim computes its deadline
from its own fork time (/proc/self/stat, never later than the daemon's start of it), and the
test checks that the read was confirmed before it.

Since JOBD_ENQUEUE files are parsed off the loop (daemon/endings.py), that parse no longer
keeps the loop busy, and the first test passes without the fix too: the second drives the
loop in-process, whatever keeps it busy, and fails without it."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, wait_until

from jobd.config import load

Daemon = Callable[..., DaemonProcess]
T = 3.0  # the queue's timeout

HANDLER = r"""
import json, os, select, socket, sys, time
boot = lambda: time.clock_gettime(time.CLOCK_BOOTTIME)
tmp = sys.argv[1]
T = float(sys.argv[2])
me = os.environ["JOBD_JOB_ID"]
if me == "victim":
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    forked = ticks / os.sysconf("SC_CLK_TCK")  # CLOCK_BOOTTIME seconds, rounded down
    deadline = forked + T  # never after the daemon's: it starts the clock after the fork
    with open(f"{tmp}/deadline.tmp", "w") as f:
        f.write(repr(deadline))
    os.rename(f"{tmp}/deadline.tmp", f"{tmp}/deadline")
    time.sleep(max(0.0, deadline - 0.4 - boot()))
    r, w = os.pipe()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    addr = os.environ["NOTIFY_SOCKET"]
    addr = "\0" + addr[1:] if addr.startswith("@") else addr
    sent = boot()
    s.sendmsg([b"EXTEND_TIMEOUT_USEC=5000000\n"],
              [(socket.SOL_SOCKET, socket.SCM_RIGHTS, w.to_bytes(4, sys.byteorder))], 0, addr)
    os.close(w)
    read = select.select([r], [], [], 2.0)[0]
    confirmed = boot()
    with open(f"{tmp}/victim.json", "w") as f:
        json.dump({"deadline": deadline, "sent": sent, "confirmed": confirmed,
                   "read": bool(read)}, f)
    time.sleep(max(0.0, deadline + 1.5 - boot()))
    open(f"{tmp}/victim-done", "w").close()
    sys.exit(0)
# the other: ends just before the victim's deadline with 10 000 follow-ups (the last line
# no job: the attempt is dead-lettered `enqueue`, nothing is written, the parse is paid)
lines = json.dumps({"queue": "sink", "payload": "x" * 100, "delay": "1h"}).encode() + b"\n"
with open(os.environ["JOBD_ENQUEUE"], "wb") as f:
    f.write(lines * 9999 + b"no job\n")
while not os.path.exists(f"{tmp}/deadline"):
    time.sleep(0.01)
deadline = float(open(f"{tmp}/deadline").read())
time.sleep(max(0.0, deadline - 0.6 - boot()))
sys.exit(0)
"""


def test_an_extension_read_before_the_deadline_is_not_stopped_as_a_timeout(
    r: redis.Redis, write_config, daemon: Daemon, tmp_path: Path
) -> None:
    h = tmp_path / "h.py"
    h.write_text(HANDLER)
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  q:\n    command: ['{sys.executable}', '{h}', '{tmp_path}', '{T}']\n"
        f"    concurrency: 2\n    timeout: {T:g}s\n    max_timeout: 20s\n    kill_grace: 1s\n"
        "    retry: {max_attempts: 1}\n"
        "  sink:\n    command: [/bin/true]\n"
    )
    q = load(str(cfg)).queues["q"]
    daemon(cfg)
    r.xadd(q.stream, {"payload": "", "job_id": "victim"})
    r.xadd(q.stream, {"payload": "", "job_id": "staller"})
    dead = q.dead_letter.stream

    def dead_ids() -> list[bytes]:
        return [f.get(b"job_id", b"") for _, f in r.xrange(dead)] if r.exists(dead) else []

    wait_until(lambda: (tmp_path / "victim-done").exists() or b"victim" in dead_ids(),
               30, what="the victim's end")  # fmt: skip
    told = json.loads((tmp_path / "victim.json").read_text())
    assert told["read"] and told["confirmed"] < told["deadline"], (
        f"inconclusive: the request was not confirmed read before the deadline: {told}"
    )
    wait_until(lambda: b"victim" in dead_ids() or (tmp_path / "victim-done").exists(), 5)
    assert b"victim" not in dead_ids(), (
        f"the victim's EXTEND_TIMEOUT_USEC was read {told['deadline'] - told['confirmed']:.3f}s "
        "before its deadline (its pipe closed: `jobd notify` exits 0), yet it was stopped as "
        f"a timeout and dead-lettered: {r.xrange(dead)}"
    )


def test_a_request_queued_before_the_deadline_is_heard_before_the_timeout_acts(
    r: redis.Redis, write_config
) -> None:
    """The same, in-process and whatever keeps the loop busy: a request the channel's thread
    queued (read before the deadline) and the loop has not taken yet (no poll since) is
    taken before the handlers act on their due time (``Handlers.act``)."""
    from test_loop import STREAM, Loop

    from jobd.process.channel import Said
    from jobd.process.handler import State

    cfg = write_config(
        "redis: {url: '{redis}'}\nshutdown_grace: 200ms\nqueues:\n"
        f"  q:\n    stream: {STREAM}\n    command: [sleep, '30']\n    timeout: 1s\n"
        "    max_timeout: 20s\n    kill_grace: 1s\n"
    )
    loop = Loop(cfg)
    try:
        r.xadd(STREAM, {"payload": ""})
        handler = loop.handler()
        read = time.monotonic()  # before its deadline: its start + 1 s
        assert read < handler.due
        item = ("said", handler, Said(extend=5_000_000, extends=1), read)
        loop.daemon.running.channel.queue.put(item)  # queued, the loop not woken yet
        loop.daemon.running.act(handler.due + 0.01)  # the pass goes on past the deadline
        assert handler.state is State.RUNNING and handler.stop_reason is None, (
            "a request for more time queued before the deadline was not heard before the "
            f"timeout acted: {handler.stop_reason}"
        )
        assert handler.due >= read + 5.0 - 0.001
    finally:
        loop.stop()
