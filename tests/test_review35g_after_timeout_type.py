"""Review of issue 35 (workflows), round 8 (review35g): b9df72d's workflows.check_after_timeout
(called by waited_for before anything is written) calls ``math.isfinite(value)`` on any int: an
int too large for a float (``after_timeout=10**400``, Python's API) raises OverflowError, not
the WorkflowError (a ValueError) it promises, so ``producer.enqueue_job``'s contract ("ValueError,
before anything is written, for a job refused") is broken: a caller catching ValueError for a
refused job (as `jobd enqueue` does) gets an uncaught OverflowError. No daemon."""

from __future__ import annotations

import pytest
import redis

from jobd import producer
from jobd.config import load
from jobd.newjob import NewJob

CONFIG = "redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n"


def test_a_python_after_timeout_too_large_for_a_float_is_a_value_error(
    r: redis.Redis, write_config
) -> None:
    config = load(str(write_config(CONFIG)))
    job = NewJob(b"p", "h", after="x", after_timeout=10**400)
    with pytest.raises(ValueError):
        producer.enqueue_job(config, "a", job)
    assert not r.hexists("{jobd:a}:held", "h")
