"""Review 34 (issue 34, the channel): an EXTEND_TIMEOUT_USEC of many digits. The docs promise a
malformed or odd message is "never fatal to the job or to jobd", and that a flood "costs the
loop a bounded amount". Here:

(a) 400 digits: ``Told.take`` (on the daemon's loop) computes ``said.extend / 1e6`` and raises
    OverflowError; ``Loop.run`` logs "internal error in the main loop", sleeps 0.1 s and skips
    the rest of the pass (reaping, timeouts, starts, the systemd heartbeat). One handler
    sending such a message every 20 ms keeps the loop from ever reaching ``act_on_due``:
    another job's 1 s timeout is not enforced while it goes on.
(b) 5000 digits: ``parse`` (on the channel's thread) calls ``int(value)`` past Python's
    4300-digit limit: ValueError ends the channel's thread; every later message of every job
    goes unheard for the daemon's life (status, progress, EXTEND_TIMEOUT_USEC, results, and
    ``jobd notify`` fails after 5 s).

Real daemon, real handlers."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, acked_all, queue_config, wait_until

Daemon = Callable[..., DaemonProcess]
ROOT = Path(__file__).resolve().parent.parent
JOBD = f"{sys.executable} -m jobd"

# Payload "DIGITS COUNT": sends COUNT EXTEND_TIMEOUT_USEC of DIGITS nines, 20 ms apart, then a
# status, then exits 0 (or, payload "sleep", sleeps 30 s).
HANDLER = """\
#!{python}
import os, socket, sys, time
args = sys.stdin.read().split()
if args[0] == "sleep":
    time.sleep(30)
    sys.exit(0)
digits, count = int(args[0]), int(args[1])
address = "\\0" + os.environ["NOTIFY_SOCKET"][1:]
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
    for _ in range(count):
        s.sendto(b"EXTEND_TIMEOUT_USEC=" + b"9" * digits, address)
        time.sleep(0.02)
    s.sendto(b"STATUS=after the extension", address)
time.sleep(0.3)
"""


def _config(write_config) -> Path:
    return write_config(
        queue_config(
            "[./h.py]",
            timeout="1s",
            max_timeout="20s",
            kill_grace="1s",
            concurrency=2,
            retry="{max_attempts: 1}",
        )
    )


def test_an_overflowing_extension_stalls_the_loop_and_another_jobs_timeout(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    script("h.py", HANDLER.format(python=sys.executable))
    d = daemon(_config(write_config))
    r.xadd("jobd:q", {"payload": "sleep", "job_id": "victim"})  # its timeout is 1 s
    d.wait_log("job=victim attempt=1 started")
    r.xadd("jobd:q", {"payload": "400 200", "job_id": "flood"})  # ~5 s of messages
    wait_until(lambda: acked_all(r, "jobd:q", 2), what="both settled")
    log = d.log()
    stopped = re.search(
        r"job=victim attempt=1 timed out (?:\(signal SIGTERM\) )?after ([0-9.]+)s", log
    )
    assert stopped, log[-2500:]
    assert float(stopped.group(1)) < 2.5, f"victim's 1 s timeout enforced at {stopped.group(1)}s"
    assert "OverflowError" not in log, "internal error in the main loop:\n" + log[-2500:]


def test_5000_digits_of_extension_end_the_channels_thread(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    script("h.py", HANDLER.format(python=sys.executable))
    d = daemon(_config(write_config))
    r.xadd("jobd:q", {"payload": "5000 1", "job_id": "huge"})
    wait_until(lambda: acked_all(r, "jobd:q", 1), what="settled")
    # The next job (of the same daemon) only says a status: it must be heard.
    r.xadd("jobd:q", {"payload": "1 1", "job_id": "later"})
    wait_until(lambda: acked_all(r, "jobd:q", 2), what="the later job settled")
    d.wait_log("job=later attempt=1 exit 0")
    log = d.log()
    assert "job=later attempt=1 told jobd: " in log, "later's messages never heard:\n" + log
