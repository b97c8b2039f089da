"""Review 35q: a deduped job's record is left out when its jobd_batch is long, though the
record names no batch then.

dedupe.lua writes a deduped job's record only when it fits beside its records
(``fits``: review 35o added its batch link, 110 + 6 * #batch bytes). But lua/lib/jobs.lua
``linked`` drops a jobd_batch over 800 bytes (someone's XADD: docs/workflows.md "named in no
record nor event"): the check counts bytes that are never written. A job whose jobd_batch is
12 000 bytes is deduped (its event told) with no `deduped` record, though the record, with no
batch in it, fits with room to spare: its end is missing from `jobd job`."""

from __future__ import annotations

import json
from pathlib import Path

import redis
from support import jobd_cli, wait_until
from test_after_batches import RUNS, runs

from jobd.config import load


def test_a_deduped_job_with_a_long_jobd_batch_has_its_record(
    r: redis.Redis, write_config, script, daemon, tmp_path: Path
) -> None:
    runs_sh = script("runs.sh", RUNS)
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  a:\n    command: [{runs_sh}]\n    dedupe: {{window: 1h}}\n"
    )
    c = str(cfg)
    daemon(cfg)
    assert jobd_cli("enqueue", "-c", c, "a", "x", "--job-id", "x").returncode == 0
    wait_until(lambda: runs(tmp_path) == ["x"], what="x run")

    def told() -> list[str]:
        out = jobd_cli("events", "-c", c, "a", "--json", "--count", "100").stdout.decode()
        return [e["event"] for e in map(json.loads, out.splitlines()) if e.get("job") == "x"]

    # Settled (its done mark written with it), not only run: a second x sent between its run and
    # its ack is no duplicate yet, and runs (the Valkey phase of the stop CI saw it once).
    wait_until(lambda: "done" in told(), what="x done")
    q = load(c).queues["a"]
    r.xadd(q.stream, {b"payload": b"x", b"job_id": b"x", b"jobd_batch": b"E" * 12000})
    wait_until(lambda: "deduped" in told(), what="the second x deduped")
    got = json.loads(jobd_cli("job", "-c", c, "a", "x", "--json").stdout)
    assert [x["event"] for x in got["records"]] == ["done", "deduped"], got["records"]
