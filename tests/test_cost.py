"""What each job cost (issue 20, in part): CPU seconds and peak memory from the reaping itself
(wait4's rusage), for every job at no extra round trip: in the exit log line, the metrics, the
dead-letter record and the job's history. Real handlers, real Redis.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Callable

import redis
from support import DaemonProcess, free_port, queue_config, wait_until

Daemon = Callable[..., DaemonProcess]

# Touches 256 MiB (well above the daemon's own size: see exitstatus.peak), burns 0.3 s of CPU,
# then fails.
HOG = (
    "import time\n"
    "block = b'x' * (256 << 20)\n"
    "start = time.process_time()\n"
    "while time.process_time() - start < 0.3:\n"
    "    pass\n"
    "raise SystemExit(3)\n"
)


def test_each_job_says_what_it_cost(r: redis.Redis, write_config, daemon: Daemon) -> None:
    port = free_port()
    command = json.dumps([sys.executable, "-c", HOG])
    config = write_config(
        queue_config(command, retry="{max_attempts: 1}")
        + f"metrics: {{listen: '127.0.0.1:{port}'}}\n"
    )
    d = daemon(config)
    r.xadd("jobd:q", {"payload": "x", "job_id": "hog"})
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 1, what="the hog dead-lettered")
    ((_, record),) = r.xrange("{jobd:q}:dead")
    assert float(record[b"jobd_cpu_seconds"]) >= 0.25
    assert int(record[b"jobd_max_rss_bytes"]) >= 256 << 20
    (history,) = [json.loads(x) for x in r.hget("{jobd:q}:history", "hog").split(b"\n")]
    assert history["cpu_seconds"] >= 0.25 and history["max_rss_bytes"] >= 256 << 20
    d.wait_log("queue=q job=hog attempt=1 exit 3 after ")
    line = next(x for x in d.log().splitlines() if "job=hog attempt=1 exit 3 after" in x)
    assert "(cpu 0." in line and "max rss " in line, line
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as page:
        metrics = page.read().decode()
    assert 'jobd_handler_cpu_seconds_count{queue="q"} 1.0' in metrics
    assert 'jobd_handler_max_rss_bytes_bucket{le="2.68435456e+08",queue="q"} 0.0' in metrics
    assert 'jobd_handler_max_rss_bytes_count{queue="q"} 1.0' in metrics


# A launcher with a large peak (300 MiB touched, then freed) that execs the daemon: exec keeps
# its peak in the daemon's getrusage figure.
LAUNCHER = (
    "import os, sys\nblock = b'x' * (300 << 20)\ndel block\nos.execv(sys.argv[1], sys.argv[1:])\n"
)


def test_a_daemon_started_by_a_large_process_still_says_what_a_job_cost(
    r: redis.Redis, write_config, daemon: Daemon
) -> None:
    """Found by CI: the daemon took its own peak from getrusage, which holds the peak of the
    process that exec'd it, so started by one larger than a handler it reported no handler's
    peak (taken for the memory a vfork child shares with the daemon). Its own is VmHWM now."""
    command = json.dumps([sys.executable, "-c", HOG])
    config = write_config(queue_config(command, retry="{max_attempts: 1}"))
    d = daemon(config, prefix=[sys.executable, "-c", LAUNCHER])
    r.xadd("jobd:q", {"payload": "x", "job_id": "hog"})
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 1, what="the hog dead-lettered")
    ((_, record),) = r.xrange("{jobd:q}:dead")
    assert int(record[b"jobd_max_rss_bytes"]) >= 256 << 20, d.log()


def test_a_peak_that_is_not_known_is_said_to_be_unknown(
    r: redis.Redis, write_config, daemon: Daemon
) -> None:
    """From the review: a handler smaller than the daemon (most shell handlers) has no peak
    jobd can tell (its wait4 figure holds the daemon's memory it shared until its exec): the
    figure was left out, with nothing to say it was unknown rather than never measured. Now
    the dead letter says it with an empty jobd_max_rss_bytes, the history with null, the log
    line with 'max rss unknown'."""
    config = write_config(queue_config("[/bin/sh, -c, 'exit 3']", retry="{max_attempts: 1}"))
    d = daemon(config)
    r.xadd("jobd:q", {"payload": "x", "job_id": "small"})
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 1, what="the job dead-lettered")
    ((_, record),) = r.xrange("{jobd:q}:dead")
    assert record[b"jobd_max_rss_bytes"] == b"" and float(record[b"jobd_cpu_seconds"]) >= 0
    (history,) = [json.loads(x) for x in r.hget("{jobd:q}:history", "small").split(b"\n")]
    assert "max_rss_bytes" in history and history["max_rss_bytes"] is None
    d.wait_log("queue=q job=small attempt=1 exit 3 after ")
    line = next(x for x in d.log().splitlines() if "job=small attempt=1 exit 3 after" in x)
    assert "max rss unknown)" in line, line
