"""Review of issue 35 (workflows), round 6 (review35e): `jobd enqueue --batch B --after …` that
is refused as a usage error (exit 2: the job waits for itself; likewise more than 100 --after,
an --after job id not UTF-8) is refused after its batch was opened and counted: producer
._enqueue opens the batch (workflows.Member) and grows it before jobd.workflows.hold checks
the dependencies. The refused enqueue then seals the batch with no member: it is complete at
once, its --on-complete callback is enqueued (total 0), and the batch takes no more jobs, so
the command run again, corrected, is refused too ("batch complete"). A usage error should
write nothing. No daemon: the callback waits in its stream."""

from __future__ import annotations

import json

import redis
from support import jobd_cli

from jobd import producer
from jobd.config import load
from jobd.newjob import NewJob


def test_an_enqueue_refused_for_its_after_leaves_no_batch(r: redis.Redis, write_config) -> None:
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n"
        "  cb:\n    command: [/bin/true]\n"
    )
    c = str(cfg)
    out = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "h", "--after", "h",
                   "--batch", "B", "--on-complete", "cb")  # fmt: skip
    assert out.returncode == 2, out.stderr  # the job cannot wait for itself: a usage error
    callbacks = r.xlen("jobd:cb") if r.exists("jobd:cb") else 0
    shown = jobd_cli("batch", "-c", c, "B").stdout.decode().strip()
    fixed = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "h", "--after", "x",
                     "--batch", "B", "--on-complete", "cb")  # fmt: skip
    assert (callbacks, shown, fixed.returncode) == (0, "", 0), fixed.stderr


def test_an_enqueue_refused_for_its_payload_leaves_no_batch(r: redis.Redis, write_config) -> None:
    """The same through producer._prepare, also run after the batch is opened: a payload above
    the queue's max_payload (refused, nothing added) completes the batch and calls back."""
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n"
        "    max_payload: 1KiB\n  cb:\n    command: [/bin/true]\n"
    )
    c = str(cfg)
    out = jobd_cli("enqueue", "-c", c, "a", "x" * 2000, "--batch", "B", "--on-complete", "cb")
    assert out.returncode != 0, out.stderr  # refused: nothing added to a
    assert not r.exists("jobd:a") or r.xlen("jobd:a") == 0
    callbacks = r.xlen("jobd:cb") if r.exists("jobd:cb") else 0
    shown = jobd_cli("batch", "-c", c, "B").stdout.decode().strip()
    assert (callbacks, shown) == (0, "")


def test_a_bulk_enqueue_whose_every_job_is_refused_leaves_no_batch(
    r: redis.Redis, write_config
) -> None:
    """enqueue_many opens the batch with the first job that passes its own checks: every job
    refused before it is sent (here above max_payload, or held: `after`) opens none; one
    taken among refused ones is the batch's one member."""
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n"
        "    max_payload: 1KiB\n  cb:\n    command: [/bin/true]\n"
    )
    config = load(str(cfg))
    big = NewJob(b"x" * 2000, batch="B", on_complete="cb")
    held = NewJob(b"p", "h", batch="B", on_complete="cb", after=("x",))
    done = producer.enqueue_many(config, "a", [big, held], batch=1)
    assert (done.job_ids, len(done.refused)) == ([], 2)
    assert not r.exists("{jobd:batch:B}") and not r.exists("jobd:cb")
    done = producer.enqueue_many(config, "a", [big, NewJob(b"ok", batch="B")], batch=1)
    assert (len(done.job_ids), len(done.refused)) == (1, 1)
    shown = jobd_cli("batch", "-c", str(cfg), "B", "--json").stdout
    assert (json.loads(shown)["total"], json.loads(shown)["state"]) == (1, "sealed"), shown
