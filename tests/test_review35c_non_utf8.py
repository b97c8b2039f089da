"""Review of issue 35 (workflows), round 4 (review35c): `--after` a job id that is not UTF-8. A
job id is any bytes (jobd.job, surrogateescape in the CLI: `jobd enqueue --job-id $'\\xff'`
works, and such a job runs); `jobd enqueue --after $'\\xffx'` is neither held nor refused as a
usage error: jobd/workflows.py hold's orjson.dumps of the dependency names raises TypeError,
and the command dies with a Python traceback (exit 1)."""

from __future__ import annotations

import os

import redis
from support import jobd_cli
from test_after_batches import CALLBACK, RUNS, batch_yaml


def test_after_a_non_utf8_job_id_is_held_or_refused_cleanly(
    r: redis.Redis, write_config, script
) -> None:
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    dep = os.fsdecode(b"\xffx")
    assert jobd_cli("enqueue", "-c", str(cfg), "a", "y", "--job-id", dep).returncode == 0
    out = jobd_cli("enqueue", "-c", str(cfg), "a", "h", "--job-id", "h", "--after", dep)
    assert b"Traceback" not in out.stderr, out.stderr.decode(errors="replace")[-400:]
    assert out.returncode in (0, 2), out.stderr
    assert out.returncode == 2 and b"is not UTF-8" in out.stderr, out.stderr  # fix35c: refused
    assert not r.exists("{jobd:a}:held"), "nothing held"
