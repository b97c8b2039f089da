"""Job history and events under the adversarial review's findings (issue 19): someone else's events
stream that refuses every new id, a renewal racing its own outcome, a lease lost to a daemon
that already runs the job, a daemon killed -9, an active record that could not be written, a
record too large for a job's share, a batch larger than the trim step, a dead daemon's record of
a job cancelled after its reclaim. Each failed before its fix.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from support import (
    DaemonProcess,
    jobd_cli,
    kill_with_handlers,
    pending_count,
    queue_config,
    wait_group,
    wait_until,
)

from jobd.config import QueueConfig, load
from jobd.job import Job
from jobd.outcome import Outcome, Ran, Verb
from jobd.store import notes
from jobd.store.keys import HISTORY_BYTES
from jobd.store.store import Store

Daemon = Callable[..., DaemonProcess]
HISTORY, ACTIVE, EVENTS = "{jobd:q}:history", "{jobd:q}:active", "{jobd:q}:events"
LAST_ID = "18446744073709551615-18446744073709551615"  # XADD * can add nothing after it


@pytest.fixture
def store(redis_server) -> Iterator[Store]:
    from jobd.config import RedisConfig

    s = Store.open(RedisConfig(url=redis_server.url), "test", "me")
    yield s
    s.close()


def q_of(write_config, **settings: object) -> QueueConfig:
    return load(write_config(queue_config("[/bin/true]", **settings))).queues["q"]


def held(r: redis.Redis, q: QueueConfig, n: int, **fields: str) -> list[Job]:
    """``n`` entries read by consumer "me"."""
    r.xgroup_create(q.stream, q.group, id="0", mkstream=True)
    for i in range(n):
        r.xadd(q.stream, {"payload": "x", "job_id": f"j{i}", **fields})
    read = r.xreadgroup(q.group, "me", {q.stream: ">"}, count=n)[0][1]
    return [Job.from_entry(q.name, mid, f) for mid, f in read]


def test_a_foreign_events_stream_that_takes_no_new_id_blocks_nothing(
    r: redis.Redis, write_config, daemon: Daemon, tmp_path: Path
) -> None:
    """Every XADD * fails on it: the outcome (its ack, its --unique mark, its counter), the
    reclaim after a crash, the renewal of the others and every operator command still work."""
    r.xadd(EVENTS, {"someone": "else"}, id=LAST_ID)
    config = write_config(
        queue_config("[/bin/sh, -c, 'sleep 0.3']", lease="{renew_every: 200ms, reclaim_after: 1s}")
    )
    d = daemon(config)
    assert (
        jobd_cli("enqueue", "-c", str(config), "--unique", "--job-id", "u1", "q", "x").returncode
        == 0
    )
    wait_until(lambda: r.get("{jobd:q}:job:u1") is None, what="the unique job done, its mark gone")
    assert records(r, "u1")[-1]["event"] == "done"
    r.xadd("jobd:q", {"payload": "x", "job_id": "orphan"})
    wait_until(lambda: pending_count(r, "jobd:q") == 1, what="the orphan to start")
    kill_with_handlers(d)
    daemon(config)
    wait_until(lambda: any(x["event"] == "done" for x in records(r, "orphan")), what="reclaimed")
    for args in (["pause", "q"], ["resume", "q"], ["cancel", "q", "nowhere"]):
        out = jobd_cli(args[0], "-c", str(config), *args[1:])
        assert out.returncode in (0, 3) and b"Traceback" not in out.stderr, out
    assert r.xlen(EVENTS) == 1, "someone else's stream, untouched"


def records(r: redis.Redis, job: str | bytes) -> list[dict]:
    raw = r.hget(HISTORY, job)
    return [json.loads(line) for line in raw.split(b"\n")] if raw else []


def test_a_renewal_that_finds_its_entry_settled_records_no_lost_lease(
    r: redis.Redis, write_config, store: Store
) -> None:
    """The ticker lists its entries, the recorder settles one, then the renewal runs: the entry
    is pending nowhere, which is no lease lost (it was, for 6 % of jobs at renew_every 20ms)."""
    q = q_of(write_config)
    (job,) = held(r, q, 1)
    r.xack(q.stream, q.group, job.message_id)
    (lost,) = store.renew(q, [job.message_id])
    assert lost.owner == "" and not r.exists(EVENTS) and not r.exists(HISTORY)


def test_a_lease_lost_to_another_daemon_leaves_its_active_record(
    r: redis.Redis, write_config, store: Store
) -> None:
    """A frozen daemon thaws after another took its job over and wrote its own active record:
    learning its loss must not delete the new owner's record."""
    q = q_of(write_config)
    (job,) = held(r, q, 1)
    r.xclaim(q.stream, q.group, "other", 0, [job.message_id])
    theirs = f'jobd:q|{job.message_id}\n{{"consumer":"other","since":1}}'
    r.hset(ACTIVE, "j0", theirs)
    store.renew(q, [job.message_id])
    assert r.hget(ACTIVE, "j0") == theirs.encode()
    assert json.loads(r.hget(HISTORY, "j0"))["owner"] == "other"


def test_a_job_whose_daemon_died_is_not_running_once_its_lease_lapsed(
    r: redis.Redis, write_config, daemon: Daemon
) -> None:
    config = write_config(
        queue_config(
            "[/bin/sh, -c, 'exec sleep 30']", lease="{renew_every: 200ms, reclaim_after: 1s}"
        )
    )
    d = daemon(config)
    r.xadd("jobd:q", {"payload": "x", "job_id": "long"})
    wait_until(lambda: r.hexists(ACTIVE, "long"), what="the job to run")
    state = lambda: json.loads(jobd_cli("job", "-c", str(config), "q", "long", "--json").stdout)  # noqa: E731
    assert state()["state"] == "running"
    kill_with_handlers(d)  # no other daemon: nobody reclaims it, its record stays
    wait_until(lambda: state()["state"] != "running", what="its lease to lapse", timeout=10)
    assert r.hexists(ACTIVE, "long"), "its record stays, no longer believed"


def test_an_active_record_that_could_not_be_written_is_written_later(
    r: redis.Redis, write_config, daemon: Daemon
) -> None:
    """Redis refuses the record's write (out of memory: it still lets a reader read and a lease
    be renewed): it is written once Redis takes writes again, while the job runs."""
    daemon(write_config(queue_config("[/bin/sh, -c, 'exec sleep 30']")))
    wait_group(r, "jobd:q")  # created before memory runs out (XGROUP CREATE is refused then)
    r.xadd("jobd:q", {"payload": "x", "job_id": "long"})
    r.config_set("maxmemory", 1)
    try:
        wait_until(lambda: pending_count(r, "jobd:q") == 1, what="the job to start")
        time.sleep(1.0)  # past ACTIVE_AFTER: the record is due, and refused
        assert not r.hexists(ACTIVE, "long")
    finally:
        r.config_set("maxmemory", 0)
    wait_until(lambda: r.hexists(ACTIVE, "long"), what="the record written later", timeout=5)


def test_a_record_larger_than_a_jobs_share_keeps_the_share_bounded(
    r: redis.Redis, write_config, store: Store
) -> None:
    """16 KiB of control bytes on stdout and stderr escape to six times that: the record's tails
    are cut to fit, and a job's records never pass HISTORY_BYTES, however often it runs."""
    q = q_of(write_config, history="{output: 16KiB}")
    jobs = held(r, q, 5, job_id="same")
    noise = b"\x01" * 16384
    for job in jobs:
        ran = Ran(1, time.monotonic(), 0.1, 0, None, noise, noise)
        store.settle([Outcome(Verb.ACK, q, job, ran=ran)])
        assert r.hstrlen(HISTORY, "same") <= HISTORY_BYTES
    assert len(r.hget(HISTORY, "same").split(b"\n")) >= 2, "whole records, the newest kept"


def test_one_call_settling_more_jobs_than_the_trim_step_keeps_maxlen(
    r: redis.Redis, write_config, store: Store
) -> None:
    q = q_of(write_config, history="{maxlen: 10}")
    store.settle([Outcome(Verb.ACK, q, job) for job in held(r, q, 300)])
    assert r.hlen(HISTORY) == 10 and r.zcard("{jobd:q}:history:at") == 10


def test_a_job_cancelled_unrun_after_a_reclaim_takes_the_dead_daemons_record(
    r: redis.Redis, write_config, store: Store
) -> None:
    q = q_of(write_config)
    (job,) = held(r, q, 1)
    r.hset(ACTIVE, "j0", f'jobd:q|{job.message_id}\n{{"consumer":"dead"}}')
    r.zadd(q.keys.cancels, {"job:j0": int(time.time() * 1000) + 60_000})
    assert store.cancelled(q, [job]) == {job.message_id}
    assert not r.hexists(ACTIVE, "j0") and records(r, "j0")[0]["event"] == "cancelled"


def test_history_output_is_at_most_16kib(write_config) -> None:
    config = write_config(queue_config("[/bin/true]", history="{output: 1MiB}"))
    out = jobd_cli("validate", str(config))
    assert out.returncode == 78 and b"history.output: is more than 16KiB" in out.stdout, out


def test_a_note_keeps_its_record_within_its_share(write_config) -> None:
    q = q_of(write_config, history="{output: 16KiB}")
    job = Job.from_entry("q", b"1-1", {b"payload": b"x"})
    noise = b"\x1b" * 16384
    note = notes.note(Outcome(Verb.ACK, q, job, ran=Ran(1, 0.0, 1.0, 0, None, noise, noise)), "me")
    assert len(note[3]) <= notes.RECORD_BYTES and json.loads(note[3])["stdout"]


def test_an_idle_queues_history_still_ages_out(
    r: redis.Redis, write_config, daemon: Daemon
) -> None:
    """No outcome is written to the queue any more: its records go after max_age all the same
    (their output tails are not kept forever)."""
    daemon(write_config(queue_config("[/bin/true]", history="{max_age: 2s}")))
    now = int(r.time()[0]) * 1000
    r.hset(HISTORY, "old", f'{{"at":{now},"event":"done","stdout":"secret"}}')
    r.zadd("{jobd:q}:history:at", {"old": now})
    wait_until(lambda: not r.hexists(HISTORY, "old"), what="the record to age out", timeout=10)
    assert r.zcard("{jobd:q}:history:at") == 0
