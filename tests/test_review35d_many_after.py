"""Review of issue 35 (workflows), round 5 (review35d): the Python bulk producer and `after`.
docs/workflows.md documents `NewJob(…, after=(…), after_any=…, after_timeout=…)` for Python and
says `--after` holds one job, refused with `--lines`/`--ndjson` (exit 2). The bulk call those
use, `jobd.producer.enqueue_many`, neither holds a job that names `after` nor refuses it:
`_prepare` ignores the field and the job is added to its stream at once, to run before (or
without) the jobs it was to wait for. Only `enqueue_job`/`submit` look at `job.after`. The
session's Redis, no daemon: a held job is never in its stream."""

from __future__ import annotations

import redis
from test_after_batches import CALLBACK, RUNS, batch_yaml

from jobd.config import load
from jobd.newjob import NewJob
from jobd.producer import enqueue_many


def test_enqueue_many_holds_or_refuses_a_job_after_others(
    r: redis.Redis, write_config, script
) -> None:
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    bulk = enqueue_many(load(str(cfg)), "a", [NewJob(b"w", job_id="w", after=("x",))])
    if bulk.refused:  # refused, as --after with --lines is: fine
        assert not r.exists("jobd:a") or r.xlen("jobd:a") == 0
        return
    assert bulk.job_ids == ["w"]
    in_stream = r.xrange("jobd:a") if r.exists("jobd:a") else []
    assert in_stream == [], f"w, which waits for x (never enqueued), is in its stream: {in_stream}"
    assert r.hexists("{jobd:a}:held", "w")


def test_enqueue_many_refuses_only_the_job_after_others_and_says_what_to_use(
    r: redis.Redis, write_config, script
) -> None:
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    jobs = [NewJob(b"1", job_id="one"), NewJob(b"w", job_id="w", after=("x",)), NewJob(b"2")]
    bulk = enqueue_many(load(str(cfg)), "a", jobs)
    assert [x.index for x in bulk.refused] == [1]
    assert "enqueue_job" in bulk.refused[0].reason, bulk.refused[0].reason
    assert len(bulk.job_ids) == 2 and r.xlen("jobd:a") == 2
    assert not r.exists("{jobd:a}:held")
