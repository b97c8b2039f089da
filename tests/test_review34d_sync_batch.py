"""Review 34d (issue 34, the handlers' channel): ``Channel.sync`` counts the messages the
channel's thread has judged, while the C reader reads up to 64 ahead of it.

docs/handlers-talking-back.md: "A handler that sends and exits is heard: before the daemon
takes the handlers that exited out of its table it waits … until the channel's thread has read
everything the socket held at that moment: until the socket is empty, or until the thread has
read as many messages as the socket can hold (`net.unix.max_dgram_qlen` + 1, 11 by default)".
``sync`` sets its target to ``count + 1 + backlog``, ``count`` being the messages ``take_one``
has judged; but ``Receiver.batch`` reads up to BATCH_MAX (64) messages at once, before any of
them is judged, so when ``sync`` begins the thread may hold up to 63 read and unjudged ahead of
what the socket holds. A handler's last message behind more than ``backlog`` of them is judged
after ``sync`` returned and its handler left the table: a stranger's. (``settled`` has the same
gap: ``take_one`` sets ``holding`` False after each stranger's message, the rest of the batch
unjudged.) Here another job floods its own channel (8 processes, messages of 63 short lines:
about 30 µs each to judge); a stranger's flood of one-line messages does it too, more rarely (1
in 300 here: a stranger's message is judged in a few µs). Checked: with ``sync``'s target raised
by BATCH_MAX and ``settled`` false while a batch is unjudged, none is lost (0 of 200, against
9 and 10 of 100 without). Real daemon, real handlers, a private Redis."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, acked_all, queue_config, wait_until

Daemon = Callable[..., DaemonProcess]
JOBS = 100
FLOODERS = 8
# The page's own Python example, in a handler that ends at once after it (as a Go or C
# program returning from main does; os._exit skips the interpreter's teardown).
HANDLER = """#!{python}
import os, socket
address = os.environ["NOTIFY_SOCKET"]
job = os.environ["JOBD_JOB_ID"]
if job == "first":
    with open({path!r}, "w") as f:
        f.write(address)
elif job == "flood":  # a job flooding its own channel, from FLOODERS processes of it
    for _ in range({flooders} - 1):
        if os.fork() == 0:
            break
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.connect("\\0" + address[1:])
        while not os.path.exists({stop!r}):
            s.send(b"STATUS=x\\n" * 63)
else:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(b"X_JOBD_RESULT=42", "\\0" + address[1:])
os._exit(0)
"""


def test_a_handlers_last_message_read_in_a_batch_is_judged_after_it_left(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Expected: every handler that sent X_JOBD_RESULT on a raw socket and exited is heard,
    while another job floods its channel ("a fraction of a millisecond"). Observed: about 1 in
    10 is done without its result, its message counted as a stranger's, with no wait of
    ``sync`` given up (the documented gap is only after one did)."""
    address, stop = tmp_path / "address", tmp_path / "stop"
    body = HANDLER.format(python=sys.executable, path=str(address), stop=str(stop),
                          flooders=FLOODERS)  # fmt: skip
    script("h.py", body)
    d = daemon(write_config(queue_config("[./h.py]", concurrency=5, timeout="5m")))
    r.xadd("jobd:q", {"payload": "", "job_id": "first"})
    wait_until(lambda: acked_all(r, "jobd:q", 1), what="the first job done")
    r.xadd("jobd:q", {"payload": "", "job_id": "flood"})
    wait_until(lambda: "job=flood attempt=1 started" in d.log(), what="the flood started")
    try:
        for i in range(JOBS):
            r.xadd("jobd:q", {"payload": "", "job_id": f"j{i}"})
        ends = [f"job=j{i} attempt=1 exit" for i in range(JOBS)]
        wait_until(lambda: all(x in d.log() for x in ends), timeout=90, what="the jobs done")
    finally:
        stop.touch()
    wait_until(lambda: acked_all(r, "jobd:q", JOBS + 2), what="the flood's job done")
    log = d.log()
    unheard = [f"j{i}" for i in range(JOBS) if f"job=j{i} attempt=1 told jobd: " not in log]
    gave_up = log.count("a wait for the thread gave up")
    # The documented gap (docs/handlers-talking-back.md): once a wait gave up (its 50 ms passed:
    # the machine overloaded, a CI run beside), the last messages of a handler that sends and
    # exits may come too late. Before the fix, results were lost with no wait given up.
    assert not unheard or gave_up, (
        f"{len(unheard)} of {JOBS} done without their result, no sync gave up: {unheard}"
    )
