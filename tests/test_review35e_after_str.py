"""Review of issue 35 (workflows), round 6 (review35e): Python's `NewJob(after=...)` takes a tuple
of job ids (docs/workflows.md: `after=("i-42", ("import", "i-43"))`); given one job id as a
str, the mistake everyone makes with a tuple of one, jobd.workflows.dependencies iterates its
characters: `after="x1"` holds the job until jobs `x` and `1` are done, jobs that never exist.
Nothing says so: enqueue_job returns the job id, and the job waits for ever (no bound unless
one is given). It is neither refused nor taken as the one job id it names."""

from __future__ import annotations

import json

import redis

from jobd import producer, workflows
from jobd.config import load
from jobd.newjob import NewJob


def test_after_given_one_job_id_as_a_str_waits_for_that_job(r: redis.Redis, write_config) -> None:
    cfg = write_config("redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n")
    config = load(str(cfg))
    try:
        producer.enqueue_job(config, "a", NewJob(b"p", "h", after="x1"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return  # refused: as good
    spec = json.loads(r.hget("{jobd:a}:after", "h"))
    assert spec["deps"] == ["a x1"], spec


def test_after_of_other_types() -> None:
    """A list is taken as a tuple; bytes, or an element neither a str nor a (QUEUE, JOB_ID)
    tuple, are a TypeError (jobd.workflows.dependencies), not a wait for what nobody named."""
    assert NewJob(b"", "h", after=["x", ("b", "y")]).after == ("x", ("b", "y"))  # type: ignore[arg-type]
    assert NewJob(b"", "h", after="").after == ()  # type: ignore[arg-type]
    try:
        NewJob(b"", "h", after=b"x1")  # type: ignore[arg-type]
    except TypeError:
        pass
    else:
        raise AssertionError("after=b'x1' taken")
    try:
        workflows.dependencies({}, "a", (("a", "x", "y"),))  # type: ignore[arg-type]
    except TypeError:
        return
    raise AssertionError("a tuple of 3 taken")
