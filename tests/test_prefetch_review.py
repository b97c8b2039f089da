"""Reading ahead, from its review: an entry handed back that the same daemon claims back before
its recorder has read the hand-back's reply keeps its new holding (renewed), so no other daemon
takes it over while it runs, and it runs once."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, wait_group, wait_until

Daemon = Callable[..., DaemonProcess]

HANDLER = """#!/bin/sh
p=$(cat)
echo "$p" >> {out}
case "$p" in mid) sleep 0.8 ;; long) sleep 8 ;; esac
"""


def config(write_config, handler: Path, renew_every: str) -> Path:
    """One slot, one entry read ahead, leases of 3 s."""
    return write_config(
        "redis: {url: '{redis}'}\nshutdown_grace: 1s\nqueues:\n  q:\n"
        f"    command: [{handler}]\n    concurrency: 1\n    prefetch: 1\n"
        f"    lease: {{renew_every: {renew_every}, reclaim_after: 3s}}\n"
    )


def slowed(**env: str) -> dict[str, str]:
    """The environment of a daemon slowed down on purpose (tests/inject/sitecustomize.py)."""
    inject = str(Path(__file__).parent / "inject")
    return {"PYTHONPATH": os.pathsep.join([inject, os.environ.get("PYTHONPATH", "")]), **env}


def enqueue_mid_then_long(r: redis.Redis) -> None:
    wait_group(r, "jobd:q")
    pipe = r.pipeline(transaction=True)
    pipe.xadd("jobd:q", {"payload": "mid", "job_id": "mid"})
    pipe.xadd("jobd:q", {"payload": "long", "job_id": "long"})
    pipe.execute()


def wait_done(r: redis.Redis, job_id: str) -> None:
    history = "{jobd:q}:history"
    wait_until(lambda: r.hexists(history, job_id) and b'"done"' in r.hget(history, job_id),
               timeout=30, what=f"{job_id} done")  # fmt: skip


def test_a_handed_back_entry_claimed_back_by_its_daemon_keeps_its_lease(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """One slot, one read ahead: `long` waits behind `mid` past the start bound and is handed
    back; `mid` ends and this daemon claims `long` back at once, while its recorder (held 0.5 s
    after the hand-back's reply) has not yet read that reply. `long` runs 8 s with reclaim_after
    3 s and another daemon idle: it is renewed, so it runs once."""
    out = tmp_path / "started"
    handler = script("h.sh", HANDLER.format(out=out))
    conf = config(write_config, handler, "500ms")
    first = daemon(conf, env=slowed(JOBD_TEST_SETTLE_DELAY="0.5"))
    enqueue_mid_then_long(r)
    wait_until(lambda: out.exists() and "long" in out.read_text(), what="long to start")
    first.wait_log("job=long attempt=1 read as no slot freed in time: handed back")
    daemon(conf)  # idle: it would take `long` over if its lease lapsed
    wait_done(r, "long")
    assert Counter(out.read_text().split())["long"] == 1, out.read_text()


def test_a_late_loss_report_on_a_handed_back_entry_spares_its_next_delivery(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """A lease renewal lists `long` while it waits, read ahead; `long` is handed back and this
    daemon claims it again and starts it while the renewal's call is under way (each takes
    0.3 s, and its loss report 0.3 s more): the report ("handed back: nobody's") is about the
    earlier delivery, and must not stop the run that started since. It runs once, to its end,
    and is delivered twice (read, claimed back), not three times."""
    out = tmp_path / "started"
    handler = script("h.sh", HANDLER.format(out=out).replace("sleep 8", "sleep 3"))
    d = daemon(config(write_config, handler, "300ms"), env=slowed(JOBD_TEST_RENEW_SLOW="0.3"))
    enqueue_mid_then_long(r)
    d.wait_log("job=long attempt=1 read as no slot freed in time: handed back")
    wait_done(r, "long")
    assert Counter(out.read_text().split())["long"] == 1, out.read_text()
    assert "job=long attempt=1 lease lost" not in d.log()
