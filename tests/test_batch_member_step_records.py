"""Review 35q: a batch member's records of its steps (promoted, reclaimed, lease lost, requeue)
name its batch: they named none.

docs/workflows.md: "A member's records carry `batch` ... every record of it". Review 35o linked
every Lua writer's record to the member's batch (lua/lib/jobs.lua ``linked``) but promote.lua
writes the `promoted` record of a due job (a --delay member, and every retried member: its
retry sits in the delayed set) without it: its records read ``scheduled B, promoted -``."""

from __future__ import annotations

import json

import redis
from support import jobd_cli, wait_until

from jobd.config import load
from jobd.store.store import Store

CONFIG = (
    "redis: {url: '{redis}'}\nqueues:\n"
    "  a:\n    command: [/bin/true]\n"
    "  cb:\n    command: [/bin/true]\n"
)


def test_a_promoted_member_record_names_its_batch(r: redis.Redis, write_config) -> None:
    c = str(write_config(CONFIG))
    out = jobd_cli("enqueue", "-c", c, "a", "x", "--job-id", "due", "--delay", "300ms",
                   "--batch", "B", "--on-complete", "cb")  # fmt: skip
    assert out.returncode == 0, out.stderr
    store, q = Store(r), load(c).queues["a"]
    r.xgroup_create(q.stream, "jobd", id="0", mkstream=True)
    wait_until(lambda: store.promote(q, 100, 1000) and r.zcard(q.keys.delayed) == 0, 10,
               what="the job due, moved to its stream")  # fmt: skip
    got = json.loads(jobd_cli("job", "-c", c, "a", "due", "--json").stdout)
    records = [" ".join((x["event"], x.get("batch", "-"))) for x in got["records"]]
    assert records == ["scheduled B", "promoted B"], records


LEASED = (
    "redis: {url: '{redis}'}\nqueues:\n"
    "  a:\n    command: [/bin/true]\n    lease: {renew_every: 200ms, reclaim_after: 1s}\n"
)
MEMBER = {"payload": "x", "jobd_batch": "B", "jobd_batch_incarnation": "5"}


def steps(r: redis.Redis, q, job: str) -> list[str]:
    """The job's records, each with the batch (and which batch of the id) it names."""
    raw = r.hget(q.keys.history, job)
    found = [json.loads(line) for line in raw.split(b"\n")] if raw else []
    return [f"{x['event']} {x.get('batch', '-')} {x.get('batch_incarnation', '-')}" for x in found]


def test_a_members_reclaimed_lease_lost_and_requeue_records_name_its_batch(
    r: redis.Redis, write_config
) -> None:
    """Review 35q: reclaim.lua's `reclaimed`, renew.lua's `lease lost` and requeue.lua's
    `requeue` records (and the requeue's event) named no batch either. A requeued job is a
    member no more (requeue.lua does not keep jobd_batch): its `requeue` names the batch it
    left."""
    q = load(str(write_config(LEASED))).queues["a"]
    r.xgroup_create(q.stream, q.group, id="0", mkstream=True)
    lapsed = r.xadd(q.stream, {**MEMBER, "job_id": "rc"})
    lost = r.xadd(q.stream, {**MEMBER, "job_id": "ll"})
    r.xreadgroup(q.group, "dead", {q.stream: ">"}, count=2)
    r.xclaim(q.stream, q.group, "me", 0, [lost])
    r.xclaim(q.stream, q.group, "other", 0, [lost])  # taken over while "me" held it
    assert [x.message_id for x in Store(r, "me").renew(q, [lost.decode()])] == [lost.decode()]
    assert steps(r, q, "ll") == ["lease lost B 5"]

    def claimed() -> bool:
        return lapsed in [c[0] for c in Store(r, "me").reclaim(q, "0-0", 1).claimed]

    wait_until(claimed, 10, what="rc reclaimed past its lease")
    assert steps(r, q, "rc") == ["reclaimed B 5"]
    dead = r.xadd(q.dead_letter.stream, {**MEMBER, "jobd_job_id": "rq", "jobd_error": "exit"})
    assert Store(r).requeue(q, [dead.decode()], "me@here").moved == [dead.decode()]
    assert steps(r, q, "rq") == ["requeued B 5"]
    (event,) = [f for _, f in r.xrange(q.keys.events) if f[b"event"] == b"requeue"]
    assert event[b"batch"] == b"B", event
    (entry,) = [f for _, f in r.xrange(q.stream) if f.get(b"jobd_job_id") == b"rq"]
    assert b"jobd_batch" not in entry, "a member no more"
