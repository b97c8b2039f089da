"""The delayed set and the dead-letter stream hold what others wrote: a bad member or record is
moved aside or left in place, never wedging the rest; time is Redis's; requeue has an end.

Each test drives the real scripts on the session's redis-server (no daemon unless it says).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from support import DaemonProcess, jobd_cli, queue_config, wait_until

from jobd import dlq, job, producer
from jobd.config import QueueConfig, load
from jobd.daemon import delayed
from jobd.store import connection as redisconn
from jobd.store.scripts import Scripts, source
from jobd.store.store import Store

Daemon = Callable[..., DaemonProcess]
DEAD = "{jobd:q}:dead"
DELAYED = "{jobd:q}:delayed"
DAY_MS = 86400 * 1000
PASSWORD = "s3cret-Pa55word"

# A cmsgpack array {'uid', 'f1', 'v', …, 'fN', 'v'} of N = ARGV[1] fields.
WIDE = """
local t = {'uid'}
for i = 1, tonumber(ARGV[1]) do t[#t + 1] = 'f' .. i; t[#t + 1] = 'v' end
return cmsgpack.pack(t)
"""


@pytest.fixture
def queue(r: redis.Redis, write_config) -> QueueConfig:
    return load(str(write_config(queue_config("[/bin/true]")))).queues["q"]


def redis_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return seconds * 1000 + micros // 1000


def packed(r: redis.Redis, lua: str) -> bytes:
    """A member built by Redis's own cmsgpack: ``lua`` is the value to pack."""
    return r.eval(f"return cmsgpack.pack({lua})", 0)


def wide(r: redis.Redis, fields: int) -> bytes:
    return r.eval(WIDE, 0, fields)


# -- (7) time is Redis's -----------------------------------------------------------------------


def test_promote_decides_due_by_redis_time_not_the_callers_clock(
    r: redis.Redis, queue: QueueConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(r)
    now = redis_ms(r)
    store.schedule(queue, {b"payload": b"in an hour"}, now + 3600_000)
    store.schedule(queue, {b"payload": b"due"}, now - 1000)
    real = delayed.now_ms
    monkeypatch.setattr(delayed, "now_ms", lambda: real() - 3600_000)  # a clock an hour slow
    delayed.Forwarder(store, queue).tick()
    assert [f[b"payload"] for _, f in r.xrange("jobd:q")] == [b"due"], "a due job waits"
    monkeypatch.setattr(delayed, "now_ms", lambda: real() + 7200_000)  # two hours fast
    delayed.Forwarder(store, queue).tick()
    assert r.xlen("jobd:q") == 1, "a job due in an hour is moved early"
    assert [w.fields[b"payload"] for w in store.delayed_list(queue)] == [b"in an hour"]


# -- (8) (9) a bad member is dead-lettered, the rest promoted ---------------------------------


def bad_members(r: redis.Redis) -> dict[bytes, str]:
    """Members promote.lua must move aside, each with (part of) the reason it gives."""
    return {
        b"\xc1 not msgpack": "not one msgpack value",
        packed(r, "42"): "not an array",
        packed(r, "{'uid'}"): "no fields",
        packed(r, "{'uid', 'payload'}"): "no fields",
        packed(r, "{a = 'b'}"): "no fields",
        packed(r, "{'uid', 'payload', 'x', 'job_id'}"): "a field name without a value",
        packed(r, "{'uid', 'payload', {'nested'}}"): "not a string",
        packed(r, "{'uid', 'payload', 'x'}") + b"\x01": "not one msgpack value",
        wide(r, job.MAX_FIELDS + 1): f"more than {job.MAX_FIELDS} fields",
        wide(r, 5000): f"more than {job.MAX_FIELDS} fields",  # past Lua's unpack limit
    }


def test_a_malformed_member_is_dead_lettered_and_the_jobs_behind_it_promoted(
    r: redis.Redis, queue: QueueConfig
) -> None:
    store = Store(r)
    now = redis_ms(r)
    bad = bad_members(r)
    for n, member in enumerate(bad):
        r.zadd(DELAYED, {member: now - 60_000 + n})  # each one ahead of the good jobs
    for n in range(3):
        fields = {b"payload": b"p%d" % n, b"job_id": b"j%d" % n}
        store.schedule(queue, fields, now - 3 + n)
    r.zadd(DELAYED, {wide(r, job.MAX_FIELDS): now})  # the widest job jobd runs
    assert delayed.Forwarder(store, queue).tick() == 4
    assert r.zcard(DELAYED) == 0
    entries = [fields for _, fields in r.xrange("jobd:q")]
    assert [f.get(b"job_id") for f in entries[:3]] == [b"j0", b"j1", b"j2"]
    assert len(entries[3]) == job.MAX_FIELDS
    records = [fields for _, fields in r.xrange(DEAD)]
    assert sorted(rec[b"jobd_member"] for rec in records) == sorted(bad)
    for rec in records:
        assert rec[b"jobd_error"] == b"malformed" and rec[b"jobd_queue"] == b"q"
        assert bad[rec[b"jobd_member"]] in rec[b"jobd_reason"].decode()
        assert abs(int(rec[b"jobd_failed_at"]) - redis_ms(r)) < 10_000
    assert set(records[0]) == {
        b"jobd_error", b"jobd_queue", b"jobd_reason", b"jobd_member", b"jobd_failed_at"
    }  # fmt: skip


def test_delayed_list_shows_a_bad_member_instead_of_failing(
    r: redis.Redis, queue: QueueConfig
) -> None:
    store = Store(r)
    store.schedule(queue, {b"payload": b"ok"}, 2000)
    r.zadd(DELAYED, {b"\xc1 garbage": 1000, wide(r, 5000): 3000})
    rows = store.delayed_list(queue)
    assert [(w.due_ms, w.fields, w.malformed) for w in rows] == [
        (1000, {}, "not one msgpack value"),
        (2000, {b"payload": b"ok"}, ""),
        (3000, {}, f"more than {job.MAX_FIELDS} fields (jobd.job.MAX_FIELDS)"),
    ]
    assert rows[0].member == b"\xc1 garbage"


@pytest.mark.parametrize("fields", [["payload"], ["payload", "x", "job_id"], []])
def test_schedule_refuses_field_arguments_that_are_not_pairs(
    r: redis.Redis, fields: list[str]
) -> None:
    with pytest.raises(redis.ResponseError, match="name, value pairs"):
        Scripts(r).schedule(keys=[DELAYED], args=[1000, "token", *fields])
    assert r.exists(DELAYED) == 0


def test_schedule_refuses_more_than_max_fields(r: redis.Redis) -> None:
    args = [x for i in range(job.MAX_FIELDS + 1) for x in (f"f{i}", "v")]
    with pytest.raises(redis.ResponseError, match=f"more than {job.MAX_FIELDS}"):
        Scripts(r).schedule(keys=[DELAYED], args=[1000, "token", *args])
    assert r.exists(DELAYED) == 0


def test_every_lua_file_naming_max_fields_agrees_with_python() -> None:
    line = re.compile(r"^local MAX_FIELDS = (\d+) -- jobd\.job\.MAX_FIELDS$", re.MULTILINE)
    folder = Path(job.__file__).parent / "store" / "lua"
    # Each script as sent to Redis (with the library its first line names): MAX_FIELDS is
    # defined once, in lua/lib/jobs.lua, for every script that uses it.
    sent = {p.stem: source(p.stem) for p in folder.glob("*.lua")}
    naming = {name: text for name, text in sent.items() if "MAX_FIELDS" in text}
    mine = {"promote", "schedule", "delayed_list", "requeue", "enqueue_unique", "dead_letter"}
    assert mine <= set(naming)
    for name, text in naming.items():
        assert [int(n) for n in line.findall(text)] == [job.MAX_FIELDS], name


# -- (9) (10) requeue: bad records left in place, and an end -----------------------------------


def test_requeue_leaves_records_it_cannot_requeue_and_moves_the_rest(
    r: redis.Redis, write_config
) -> None:
    config = str(write_config(queue_config("[/bin/true]")))
    r.xadd(DEAD, {"payload": "a", "jobd_job_id": "a", "jobd_error": "exit"})
    only_jobd = r.xadd(DEAD, {"jobd_error": "malformed", "jobd_member": b"\xc1"})
    only_id = r.xadd(DEAD, {"jobd_job_id": "x", "jobd_error": "exit"})
    too_wide = r.xadd(DEAD, {f"f{i}": "v" for i in range(job.MAX_FIELDS)} | {"jobd_job_id": "w"})
    huge = r.xadd(DEAD, {f"f{i}": "v" for i in range(5000)})
    # What dead_letter.lua keeps of a job wider than MAX_FIELDS: not the whole job.
    cut = r.xadd(DEAD, {"payload": "c", "job_id": "c", "jobd_fields": "1500"})
    r.xadd(DEAD, {"payload": "b", "jobd_job_id": "b", "jobd_attempt": "5"})
    run = jobd_cli("dlq", "-c", config, "q", "requeue", "--all")
    assert run.returncode == 1 and run.stdout == b"requeued 2 job(s) to jobd:q\n", run
    assert run.stderr.decode().splitlines() == [
        f"jobd: left dead letter {only_jobd.decode()} in place: no job fields (only jobd_* ones)",
        f"jobd: left dead letter {only_id.decode()} in place: no job fields (only jobd_* ones)",
        f"jobd: left dead letter {too_wide.decode()} in place: more than 1000 fields (jobd.job.MAX_FIELDS)",
        f"jobd: left dead letter {huge.decode()} in place: more than 1000 fields (jobd.job.MAX_FIELDS)",
        f"jobd: left dead letter {cut.decode()} in place: truncated: the job had 1500 fields, more than 1000",
    ]
    assert [f for _, f in r.xrange("jobd:q")] == [
        {b"payload": b"a", b"jobd_job_id": b"a"},
        {b"payload": b"b", b"jobd_job_id": b"b"},
    ]
    assert [mid for mid, _ in r.xrange(DEAD)] == [only_jobd, only_id, too_wide, huge, cut]


def test_requeue_all_ends_at_the_newest_record_when_it_started(
    r: redis.Redis, queue: QueueConfig
) -> None:
    pipe = r.pipeline(transaction=False)
    for i in range(1200):  # three chunks
        pipe.xadd(DEAD, {"payload": str(i), "jobd_job_id": f"j-{i}", "jobd_error": "exit"})
    before = {mid.decode() for mid in pipe.execute()}
    store = Store(r)
    real = store.scripts.requeue
    budget = [5000]  # bounds the old endless loop, so it fails instead of hanging

    def and_fail_again(keys: list, args: list, client: object = None) -> object:
        """The script, then every job it requeued dead-lettered again at once (a job that
        fails fast, with daemons running while an operator requeues)."""
        length = r.xlen(DEAD)
        reply = real(keys=keys, args=args)
        again = min(length - r.xlen(DEAD), budget[0])
        budget[0] -= again
        pipe = r.pipeline(transaction=False)
        for _ in range(again):
            pipe.xadd(DEAD, {"payload": "again", "jobd_job_id": "again", "jobd_error": "exit"})
        pipe.execute()
        return reply

    store.scripts.requeue = and_fail_again  # type: ignore[assignment]
    moved = dlq.requeue_all(store, queue, "t@h")
    assert len(moved) == 1200 and set(moved) == before
    assert r.xlen("jobd:q") == 1200 and r.xlen(DEAD) == 1200, "the new failures wait"


# -- unique jobs stay unique on requeue --------------------------------------------------------


def test_requeue_keeps_a_unique_job_unique_and_sets_its_mark_again(
    r: redis.Redis, write_config
) -> None:
    config = str(write_config(queue_config("[/bin/true]")))
    raw = b"\xffu-1"  # not UTF-8: a job id is any bytes
    record = {
        b"payload": b"x", b"job_id": raw, b"jobd_unique": b"1", b"jobd_job_id": raw,
        b"jobd_error": b"exit", b"jobd_attempts": b"1",
    }  # fmt: skip
    first = r.xadd(DEAD, record).decode()
    second = r.xadd(DEAD, {**record, b"job_id": b"u-2", b"jobd_job_id": b"u-2"}).decode()
    r.set(b"{jobd:q}:job:u-2", "done", px=3600_000)  # done again meanwhile: kept
    no_id = r.xadd(DEAD, {b"payload": b"y", b"jobd_unique": b"1"}).decode()  # no mark to set
    run = jobd_cli("dlq", "-c", config, "q", "requeue", first, second, no_id)
    assert run.returncode == 0 and run.stdout == b"requeued 3 job(s) to jobd:q\n", run
    assert set(r.keys("{jobd:q}:job:*")) == {b"{jobd:q}:job:" + raw, b"{jobd:q}:job:u-2"}
    entries = [fields for _, fields in r.xrange("jobd:q")]
    assert entries[0] == {
        b"payload": b"x",
        b"job_id": raw,
        b"jobd_job_id": raw,
        b"jobd_unique": b"1",
    }
    assert entries[1][b"jobd_unique"] == b"1"
    mark = b"{jobd:q}:job:" + raw
    assert r.get(mark) == b"queued"
    assert 7 * DAY_MS - 60_000 < r.pttl(mark) <= 7 * DAY_MS
    assert r.get(b"{jobd:q}:job:u-2") == b"done" and r.pttl(b"{jobd:q}:job:u-2") <= 3600_000


def test_dlq_finds_a_record_by_a_job_id_that_is_not_utf8(r: redis.Redis, write_config) -> None:
    config = str(write_config(queue_config("[/bin/true]")))
    r.xadd(DEAD, {b"payload": b"x", b"jobd_job_id": b"\xffj", b"jobd_error": b"exit"})
    ref = os.fsdecode(b"\xffj")  # what the shell passes: the bytes themselves
    shown = jobd_cli("dlq", "-c", config, "q", "show", ref)
    assert shown.returncode == 0 and b"jobd_job_id: \\xffj" in shown.stdout, shown
    run = jobd_cli("dlq", "-c", config, "q", "requeue", ref)
    assert run.returncode == 0 and run.stdout == b"requeued 1 job(s) to jobd:q\n", run
    assert [f[b"jobd_job_id"] for _, f in r.xrange("jobd:q")] == [b"\xffj"]


def test_a_requeued_unique_job_refuses_a_duplicate_until_it_is_done(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", f"#!/bin/sh\necho run >> {tmp_path}/ran\n[ -e {tmp_path}/fixed ] || exit 65\n")
    config = write_config(queue_config("[./h.sh]"))
    c = str(config)
    d = daemon(config)
    assert jobd_cli("enqueue", "-c", c, "q", "x", "--job-id", "u-1", "--unique").returncode == 0
    wait_until(lambda: r.xlen(DEAD) == 1, what="the job dead-lettered")
    assert r.exists("{jobd:q}:job:u-1") == 0, "dead-lettering deleted the mark"
    assert d.stop() == 0
    # Requeued: queued again, so a duplicate is refused until it is done or dead again.
    assert jobd_cli("dlq", "-c", c, "q", "requeue", "u-1").returncode == 0
    assert r.get("{jobd:q}:job:u-1") == b"queued"
    dup = jobd_cli("enqueue", "-c", c, "q", "x", "--job-id", "u-1", "--unique")
    assert dup.returncode == 3, dup
    daemon(config)
    wait_until(lambda: r.xlen(DEAD) == 1 and r.exists("{jobd:q}:job:u-1") == 0)
    (tmp_path / "fixed").touch()
    assert jobd_cli("dlq", "-c", c, "q", "requeue", "u-1").returncode == 0
    wait_until(lambda: r.xlen(DEAD) == 0 and (tmp_path / "ran").read_text().count("run") == 3)
    wait_until(lambda: r.exists("{jobd:q}:job:u-1") == 0, what="the mark cleared when done")


# -- (11) a unique job's mark outlives its due time ------------------------------------------


def test_a_far_future_unique_jobs_mark_lasts_until_it_is_due_and_then_some(
    r: redis.Redis, write_config
) -> None:
    cfg = load(str(write_config(queue_config("[/bin/true]"))))
    producer.enqueue(cfg, "q", b"x", job_id="now", unique=True, client=r)
    producer.enqueue(
        cfg, "q", b"x", job_id="far", at=time.time() + 8 * 86400, unique=True, client=r
    )
    week = 7 * DAY_MS
    assert week - 60_000 < r.pttl("{jobd:q}:job:now") <= week
    assert 15 * DAY_MS - 60_000 < r.pttl("{jobd:q}:job:far") <= 15 * DAY_MS
    with pytest.raises(producer.Duplicate):
        producer.enqueue(cfg, "q", b"x", job_id="far", unique=True, client=r)


def test_enqueue_unique_refuses_bad_fields_before_it_writes(r: redis.Redis) -> None:
    scripts = Scripts(r)
    keys = ["jobd:q", DELAYED, "{jobd:q}:job:w"]
    wide_args = [x for i in range(5000) for x in (f"f{i}", "v")]
    for fields in (wide_args, ["payload", "x", "job_id"], []):
        with pytest.raises(redis.ResponseError):
            scripts.enqueue_unique(keys=keys, args=[60_000, 0, "m", *fields])
        assert r.exists(*keys) == 0, "no mark left behind, nothing added"


def test_producer_refuses_a_job_wider_than_max_fields() -> None:
    # counted as the reading daemon counts (Job.too_wide): jobd_job_id, jobd_attempt and
    # jobd_origin come on top of a job's own fields
    producer.check_width({b"f%d" % i: b"v" for i in range(job.MAX_FIELDS - 3)})
    with pytest.raises(producer.ProducerError, match="at most 1000 fields with jobd's own"):
        producer.check_width({b"f%d" % i: b"v" for i in range(job.MAX_FIELDS - 2)})


def test_enqueue_keeps_a_job_id_that_is_not_utf8(r: redis.Redis, write_config) -> None:
    cfg = load(str(write_config(queue_config("[/bin/true]"))))
    job_id = os.fsdecode(b"\xffj")
    assert producer.enqueue(cfg, "q", b"x", job_id=job_id, client=r) == job_id
    producer.enqueue(cfg, "q", b"x", job_id=job_id, at=time.time() + 60, client=r)
    producer.enqueue(cfg, "q", b"x", job_id=os.fsdecode(b"\xffu"), unique=True, client=r)
    assert [f[b"job_id"] for _, f in r.xrange("jobd:q")] == [b"\xffj", b"\xffu"]
    assert [w.fields[b"job_id"] for w in Store(r).delayed_list(cfg.queues["q"])] == [b"\xffj"]
    assert r.get(b"{jobd:q}:job:\xffu") == b"queued"


# -- (15) purge (and requeue) under a minimal ACL user ----------------------------------------


@pytest.fixture
def acl_user(r: redis.Redis) -> Iterator[str]:
    """The documented ACL user (redisconn.ACL_COMMANDS): no MULTI, no EXEC."""
    assert "multi" not in redisconn.ACL_COMMANDS and "exec" not in redisconn.ACL_COMMANDS
    rules = ["on", f">{PASSWORD}", "~jobd:*", "~{jobd:*", "resetchannels", "-@all"]
    rules += [f"+{command}" for command in redisconn.ACL_COMMANDS]
    r.execute_command("ACL", "SETUSER", "jobd-dlq-test", "reset", *rules)
    yield "jobd-dlq-test"
    r.acl_deluser("jobd-dlq-test")


def acl_config(write_config, tmp_path: Path, user: str) -> str:
    (tmp_path / "redis.password").write_text(PASSWORD + "\n")
    return str(
        write_config(
            f"redis: {{url: '{{redis}}', username: {user}, password_file: redis.password}}\n"
            "queues:\n  q: {command: [/bin/true]}\n"
        )
    )


def test_dlq_purge_needs_no_transaction(
    r: redis.Redis, acl_user: str, write_config, tmp_path: Path
) -> None:
    for i in range(3):
        r.xadd(DEAD, {"payload": str(i), "jobd_job_id": f"j-{i}"})
    purged = jobd_cli(
        "dlq", "-c", acl_config(write_config, tmp_path, acl_user), "q", "purge", "--yes"
    )
    assert purged.returncode == 0 and not purged.stderr, purged
    assert purged.stdout == b"purged 3 dead letter(s) from {jobd:q}:dead\n"
    assert r.exists(DEAD) == 0


def test_dlq_requeue_needs_only_the_documented_commands(
    r: redis.Redis, acl_user: str, write_config, tmp_path: Path
) -> None:
    c = acl_config(write_config, tmp_path, acl_user)
    for i in range(3):
        r.xadd(DEAD, {"payload": str(i), "job_id": f"j-{i}", "jobd_unique": "1"})
    run = jobd_cli("dlq", "-c", c, "q", "requeue", "--all")
    assert run.returncode == 0 and not run.stderr, run
    assert r.mget([f"{{jobd:q}}:job:j-{i}" for i in range(3)]) == [b"queued"] * 3
