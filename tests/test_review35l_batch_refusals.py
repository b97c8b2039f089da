"""Review of issue 35 (workflows), round 35l: enqueues into a batch that add no job, yet open it
and seal it empty: the batch is complete at once (`total` 0), its `--on-complete` callback is
enqueued, and the batch takes no more jobs (the real run, next, is refused: "complete").

Review 35k's fix (workflows.waited_for with the store, ended_already) checks two refusals before
the batch opens: a job held already that waits for other jobs, and a hold that ended. Every
other enqueue that Redis answers "not added" still goes through producer._enqueue's
`member.grow(1)` (batch.lua 'open', 'add') then `member.added(0)` and `Member.__exit__`'s seal
with a count of 0 (jobd/workflows.py Member.__exit__: sealed whenever no round trip was cut):

1. a job held already, waiting for the same jobs, enqueued again with `--batch B` (exit 0: "held
   already", nothing changed): hold.lua answers 0, the job is not B's member (its entry has no
   jobd_batch), and B is complete with no member;
2. an `--ndjson --batch B` line with `"unique": true` whose job id is there already (the CLI
   refuses `--batch --unique`, docs/workflows.md: "`--batch` does not go with `--unique` (a
   member not added would be counted)", but not a line's `unique`), and the Python producer's
   `NewJob(unique=True, batch=...)`: refused as a duplicate, B complete, called back empty;
3. a job Redis refuses (here the queue's stream key is of another type: WRONGTYPE): the enqueue
   fails, and B is complete with `total` 0.

What should happen, as docs/workflows.md says of the refusals checked before: "leaves the batch
as it was: it neither opens it nor seals it (sealed empty, it would be complete and call back
with `total` 0)". Suggested fix: in lua/batch.lua, a seal whose adder's count is 0 takes that
adder off (and, when no adder ever counted a job, leaves the batch as it was: no batch made, no
seal), rather than sealing; or refuse `unique` with a batch in newjob/ndjson as the CLI does,
and check hold.lua's "held already" before the batch opens (as 35k did for other deps)."""

from __future__ import annotations

import json

import pytest
import redis
from support import jobd_cli

from jobd import producer
from jobd.config import load
from jobd.newjob import NewJob

CONFIG = (
    "redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n"
    "  cb:\n    command: [/bin/true]\n"
)


def _no_batch(r: redis.Redis, c: str) -> None:
    cb = load(c).queues["cb"]
    callbacks = r.xrange(cb.stream) if r.exists(cb.stream) else []
    shown = jobd_cli("batch", "-c", c, "B", "--json")
    assert not callbacks, (
        f"nothing was added to batch B, yet it was made and called back: {callbacks}; "
        f"jobd batch B: {shown.stdout.decode().strip()}"
    )
    assert shown.returncode == 3, f"batch B exists: {shown.stdout.decode().strip()}"


def test_a_held_job_enqueued_again_into_a_batch_makes_no_empty_batch(
    r: redis.Redis, write_config
) -> None:
    c = str(write_config(CONFIG))
    out = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "x", "--after", "d1")
    assert out.returncode == 0, out.stderr
    out = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "x", "--after", "d1",
                   "--batch", "B", "--on-complete", "cb")  # fmt: skip
    assert out.returncode == 0, out.stderr  # held already: the same job, nothing to do
    _no_batch(r, c)


def test_an_ndjson_unique_duplicate_makes_no_empty_batch(r: redis.Redis, write_config) -> None:
    c = str(write_config(CONFIG))
    out = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "u", "--unique")
    assert out.returncode == 0, out.stderr
    line = json.dumps({"payload": "p", "job_id": "u", "unique": True}).encode() + b"\n"
    out = jobd_cli("enqueue", "-c", c, "a", "--ndjson", "-", "--batch", "B",
                   "--on-complete", "cb", stdin=line)  # fmt: skip
    assert b"already there" in out.stderr, out.stderr  # the duplicate, not added
    _no_batch(r, c)


def test_a_python_unique_duplicate_makes_no_empty_batch(r: redis.Redis, write_config) -> None:
    c = str(write_config(CONFIG))
    config = load(c)
    producer.enqueue_job(config, "a", NewJob(b"p", "u", unique=True))
    with pytest.raises(producer.Duplicate):
        producer.enqueue_job(config, "a", NewJob(b"p", "u", unique=True, batch="B",
                                                 on_complete="cb"))  # fmt: skip
    _no_batch(r, c)


def test_a_job_redis_refuses_makes_no_empty_batch(r: redis.Redis, write_config) -> None:
    c = str(write_config(CONFIG))
    a = load(c).queues["a"]
    r.set(a.stream, b"garbage of someone else")  # the stream's key, of another type
    out = jobd_cli("enqueue", "-c", c, "a", "p", "--batch", "B", "--on-complete", "cb")
    assert out.returncode != 0, out.stderr  # Redis refused it: not added
    assert b"WRONGTYPE" in out.stderr, out.stderr
    _no_batch(r, c)
