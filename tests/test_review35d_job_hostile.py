"""Review of issue 35 (workflows), round 5 (review35d): `jobd job` of a held job whose records
are not what jobd wrote: a `waiting` record whose `after` is no list (someone else's HSET on the
queue's history hash, a hostile entry). `jobd job --json` (store/records.py links) checks its
type; the text view (cli/history.py held_text) takes len() of it and dies with a traceback, exit
1, instead of showing the job, as it does for every other record it cannot read ("skipped").
The CLI against the session's Redis."""

from __future__ import annotations

from pathlib import Path

import redis
from support import jobd_cli
from test_after_batches import CALLBACK, RUNS, batch_yaml


def test_jobd_job_of_a_held_job_with_a_hostile_waiting_record(
    r: redis.Redis, write_config, script, tmp_path: Path
) -> None:
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    c = str(cfg)
    assert jobd_cli("enqueue", "-c", c, "a", "h", "--job-id", "h", "--after", "x").returncode == 0
    old = r.hget("{jobd:a}:history", "h")
    r.hset("{jobd:a}:history", "h", old.replace(b'"after":["a x"]', b'"after":true'))
    for extra in (("--json",), ()):
        shown = jobd_cli("job", "-c", c, "a", "h", *extra)
        assert shown.returncode == 0 and b"Traceback" not in shown.stderr, shown.stderr[-600:]
