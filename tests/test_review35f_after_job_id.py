"""Review of issue 35 (workflows), round 7 (review35f): workflows.waited_for, which review 35e
made the check of a held job's --after before anything is written (its batch too), checks that
each job id is UTF-8 and not the job's own, but not that it is a job id at all: one longer than
jobd.job.MAX_JOB_ID (1024 bytes), which `jobd enqueue --job-id` refuses (exit 2) and the read
scripts cut, so no job of that id can ever be added, is taken. The job is held for a job that
can never end: for ever when it has no bound (no --after-timeout, no max_wait), its batch never
completing, and `jobd enqueue` exits 0 as if all were well (the same typo'd or mangled id that
--job-id refuses). Python's ``NewJob(after=...)`` takes it too (here 100 of 200 KB: a held
entry of 20 MB). No daemon."""

from __future__ import annotations

import contextlib

import redis
from support import jobd_cli

from jobd import producer
from jobd.config import load
from jobd.newjob import NewJob

CONFIG = (
    "redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n"
    "  cb:\n    command: [/bin/true]\n"
)


def test_an_after_job_id_no_job_can_have_is_a_usage_error(r: redis.Redis, write_config) -> None:
    c = str(write_config(CONFIG))
    long = "d" * 1025
    refused = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", long)
    assert refused.returncode == 2  # no job can have it
    out = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "h", "--after", long,
                   "--batch", "B", "--on-complete", "cb")  # fmt: skip
    held = r.hexists("{jobd:a}:held", "h")
    assert (out.returncode, held, r.exists("{jobd:batch:B}")) == (2, False, 0), out.stderr


def test_python_after_job_ids_are_bounded(r: redis.Redis, write_config) -> None:
    config = load(str(write_config(CONFIG)))
    after = tuple(f"{i}" + "x" * 200_000 for i in range(100))
    with contextlib.suppress(ValueError):  # refused: fine, so long as nothing was written
        producer.enqueue_job(config, "a", NewJob(b"p", "h", after=after))
    assert not r.hexists("{jobd:a}:held", "h")
