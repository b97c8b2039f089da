"""Review of issue 35 (workflows), round 6 (review35e): a batch member read as a stand-in (its
entry larger than the queue's max_payload and job.ENTRY_SLACK: lua/lib/jobs.lua ``sized``) is
dead-lettered malformed, an end, but its batch is never told: the stand-in keeps job_id,
jobd_job_id and jobd_unique and drops jobd_batch (and jobd_origin, jobd_parent), and
dead_letter.lua's ``ended`` takes the batch from the note (store/notes.py: the fields read). The
member is one jobd's producer added within the limit of its day: the queue's max_payload was
lowered since ("a larger job is dead-lettered as malformed without running"), so the batch
stays sealed with a member pending for ever and never calls back. Real daemon and handlers."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli, wait_until
from test_after_batches import CALLBACK, RUNS, callbacks

from jobd import producer
from jobd.config import load
from jobd.newjob import NewJob
from jobd.store.store import Store

Daemon = Callable[..., DaemonProcess]


def test_a_batch_member_dead_lettered_as_oversize_is_counted_failed(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    runs_sh, cb = script("runs.sh", RUNS), script("cb.sh", CALLBACK)
    text = (
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  a:\n    command: [{runs_sh}]\n    max_payload: LIMIT\n"
        f"  cb:\n    command: [{cb}]\n"
    )
    before = write_config(text.replace("LIMIT", "4MiB"), "before.yaml")
    producer.enqueue_job(load(str(before)), "a",
                         NewJob(b"x" * (2 << 20), "big", batch="B", on_complete="cb"))  # fmt: skip
    after = write_config(text.replace("LIMIT", "1KiB"))  # lowered since
    daemon(after)
    wait_until(lambda: r.exists("{jobd:a}:dead") and r.xlen("{jobd:a}:dead") == 1, 20,
               what="the member dead-lettered (malformed: too large)")  # fmt: skip
    shown = jobd_cli("batch", "-c", str(after), "B", "--json")
    wait_until(lambda: callbacks(tmp_path), 10,
               what=f"the callback (batch now: {shown.stdout!r})")  # fmt: skip
    assert [json.dumps(c, sort_keys=True) for c in callbacks(tmp_path)] == [
        json.dumps(
            {"batch": "B", "state": "complete", "total": 1, "done": 0, "failed": 1, "pending": 0},
            sort_keys=True,
        )
    ]


def test_a_stand_in_keeps_the_workflow_fields_jobd_writes_and_no_longer_ones(
    r: redis.Redis, write_config
) -> None:
    """The read script's stand-in (lua/lib/jobs.lua sized) keeps jobd_batch, jobd_origin and
    jobd_parent as jobd writes them, bounded: a value longer than any jobd writes is left out
    (never cut into another batch's id), so a stand-in stays a few KiB."""
    cfg = write_config("redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n"
                       "    max_payload: 1KiB\n")  # fmt: skip
    q = load(str(cfg)).queues["a"]
    store = Store(r, "reader")
    store.ensure_group(q)
    big = b"x" * (2 << 20)
    kept = {b"job_id": b"j", b"jobd_batch": "é".encode() * 200, b"jobd_origin": b"o" * 64,
            b"jobd_parent": b"b " + b"p" * 1024}  # fmt: skip
    r.xadd(q.stream, {b"payload": big, **kept})
    r.xadd(q.stream, {b"payload": big, b"job_id": b"k", b"jobd_batch": b"B" * 801,
                      b"jobd_origin": b"o" * 65, b"jobd_parent": b"p" * 2049})  # fmt: skip
    (_, first), (_, second) = store.read_new(q, 10, None).entries
    assert first == {b"jobd_oversize": first[b"jobd_oversize"], **kept}
    assert second == {b"jobd_oversize": second[b"jobd_oversize"], b"job_id": b"k"}
