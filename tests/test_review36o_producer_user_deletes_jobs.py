"""Review 36o of issue 36: the producer-only ACL user that d53cf0b documents (docs/operations/
redis.md, "A producer-only user": ``ACL SETUSER producer on >PW ~jobd:* resetchannels -@all
+xadd``) "cannot read or delete jobs", the docs say, and docs/security.md's threat model rests
on it. It can delete them: ``XADD`` takes ``MAXLEN``/``MINID`` and trims the stream as it adds
(Redis ACLs cannot forbid an argument), ignoring consumer groups (trim.lua's own header says so
of ``XTRIM``: before Redis 8.2 it removes pending and undelivered entries alike).

Reproduced as that very user: three jobs enqueued, a daemon holding one; one ``XADD jobd:q
MAXLEN = 1 * …`` from the producer, and the two waiting jobs are gone (never run, never
dead-lettered, no record), the running one's entry too (its pending record stays, its fields
gone). The reviewer also noted the user cannot ``XADD`` to a priority level's stream
(``{jobd:q}:priority:high``), where docs/concepts/scheduling.md tells producers to.

What should happen: the docs say what such a user can do: delete any undelivered or pending
job of the queues it may write (``MAXLEN``/``MINID``), so a producer-only user is no defence
against a hostile producer deleting others' jobs, only against it making groups and consumers.
(Redis 7.0 has no ACL rule on an argument; a wrapper script, ``+evalsha`` of one loaded script
doing ``XADD … *`` alone, would be the enforced alternative.)

Fixed (docs/operations/redis.md, docs/security.md): the section says the user can delete jobs,
what becomes of them (tested here: a waiting job gone unrecorded; a running job's entry dropped
from the group by the next reclaim pass, and its end, even a success, not recorded), that no
Redis or jobd setting prevents it (a script wrapping ``XADD`` runs under the caller's ACL:
tested here too, so the suggested wrapper does not work), and what to do instead. Its ACL
example names each priority level's stream (``~{jobd:*}:priority:high``), not their derived
keys. The running job's end going unrecorded is a defect of its own, reported, not fixed here.

Fixed (task f35d, lib/workflows.lua lost_end; renew.lua): the running job's end is recorded now,
once, as 'lost' under its job id (the renewal that finds its entry gone writes it, with the job
id the daemon sends), told to its batch and waiters as a failure; still neither retried nor
dead-lettered (its payload is gone). The test below asserts that, and the docs say so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from support import DaemonProcess, RedisServer, wait_until

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "docs").is_dir())
DOCS = ROOT / "docs" / "operations" / "redis.md"
LEVELS = ("high", "low")

HANDLER = """#!/bin/sh
cat >/dev/null
echo "$JOBD_JOB_ID" >> "$(dirname "$0")/runs"
while [ ! -e "$(dirname "$0")/go" ]; do sleep 0.05; done
"""


def section() -> str:
    text = DOCS.read_text()
    part = text[text.index("### A producer-only user") :]
    return part[: part.index("\n#", 1)] if "\n#" in part[1:] else part


def documented_rule() -> str:
    found = re.search(r"^ACL SETUSER producer .*$", section(), re.M)
    assert found, "the documented user"
    return found[0]


@pytest.fixture
def producer(r: redis.Redis, redis_server: RedisServer):  # type: ignore[no-untyped-def]
    r.execute_command(*documented_rule().replace(">PW", ">pw-36o").split())
    client = redis.Redis(port=redis_server.port, username="producer", password="pw-36o")
    yield client
    client.close()
    r.acl_deluser("producer")


def test_the_documented_user_writes_every_priority_level_and_no_derived_key(
    r: redis.Redis, producer: redis.Redis
) -> None:
    rule = documented_rule()
    assert rule.endswith("resetchannels -@all +xadd"), rule  # XADD alone
    for stream in ("jobd:q", *(f"{{jobd:q}}:priority:{level}" for level in LEVELS)):
        producer.xadd(stream, {"payload": "p"})  # a queue's stream, each level's
    for key in ("{jobd:q}:delayed", "{jobd:q}:dead", "{jobd:q}:priority:high:delayed",
                "{jobd:q}:priority:high:trim", "{jobd:daemons}"):  # fmt: skip
        with pytest.raises(redis.exceptions.NoPermissionError):
            producer.xadd(key, {"payload": "p"})
    sha = r.script_load("return redis.call('XADD', KEYS[1], '*', 'payload', 'x')")
    r.acl_setuser("wrapped", enabled=True, passwords=["+pw"], keys=["jobd:*"],
                  commands=["-@all", "+evalsha"])  # fmt: skip
    wrapped = redis.Redis(port=producer.connection_pool.connection_kwargs["port"],
                          username="wrapped", password="pw")  # fmt: skip
    try:
        refused = r"can't run this command|no permissions to run"  # Redis's, Valkey's
        with pytest.raises(redis.ResponseError, match=refused):
            wrapped.evalsha(sha, 1, "jobd:q")  # a wrapper runs under the caller's ACL
    finally:
        wrapped.close()
        r.acl_deluser("wrapped")


def test_the_producer_only_user_deletes_waiting_jobs_and_running_entries(
    r: redis.Redis, producer: redis.Redis
) -> None:
    text = " ".join(section().split())
    assert "cannot read or delete jobs" not in text
    for said in ("It can delete jobs.", "`MAXLEN` and `MINID`", "No setting of Redis or of jobd"):
        assert said in text, said
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    running = r.xadd("jobd:q", {"payload": "p", "job_id": "running"})
    r.xadd("jobd:q", {"payload": "p", "job_id": "waiting-1"})
    r.xadd("jobd:q", {"payload": "p", "job_id": "waiting-2"})
    r.xreadgroup("jobd", "host-1-abcdabcdabcdabcd", {"jobd:q": ">"}, count=1)
    producer.xadd("jobd:q", {"payload": "mine"}, maxlen=1, approximate=False)
    left = [fields[b"payload"] for _, fields in r.xrange("jobd:q")]
    assert left == [b"mine"], left  # the three jobs are gone
    assert r.xpending("jobd:q", "jobd")["pending"] == 1  # its record, not its entry
    assert not r.xrange("jobd:q", running, running)


def test_a_running_job_whose_entry_is_trimmed_is_stopped_and_its_end_recorded_lost(
    r: redis.Redis,
    producer: redis.Redis,
    write_config: Callable[..., Path],
    script: Callable[[str, str], Path],
    daemon: Callable[..., DaemonProcess],
    tmp_path: Path,
) -> None:
    text = " ".join(section().split())
    for said in ("dropped from the group", "its end is recorded as `lost`",
                 "lease lost: the entry now belongs to nobody (acked elsewhere, or trimmed); "
                 "stopping the handler"):  # fmt: skip
        assert said in text, said
    handler = script("h.sh", HANDLER)
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n  q:\n"
        f"    command: [{handler}]\n    concurrency: 1\n"  # no slot free: no reclaim pass
        "    lease: {renew_every: 200ms, reclaim_after: 1s}\n"
    )
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    running = r.xadd("jobd:q", {"payload": "p", "job_id": "running"})
    d = daemon(cfg)
    wait_until(lambda: (tmp_path / "runs").exists(), what="the job running")
    producer.xadd("jobd:q", {"payload": "mine", "job_id": "mine"}, maxlen=1, approximate=False)
    assert not r.xrange("jobd:q", running, running)
    d.wait_log("job=running attempt=1 lease lost: the entry now belongs to nobody (acked "
               "elsewhere, or trimmed); stopping the handler")  # fmt: skip
    d.wait_log("job=running attempt=1 signal SIGTERM")  # stopped mid-run
    wait_until(lambda: "mine" in (tmp_path / "runs").read_text().split(), what="the next job")
    assert r.xpending("jobd:q", "jobd")["pending"] == 1  # the producer's own, running
    record = json.loads(r.hget("{jobd:q}:history", "running").splitlines()[-1])
    assert (record["event"], record["entry"].encode()) == ("lost", running), record  # by job id
    events = [f for _, f in r.xrange("{jobd:q}:events") if f.get(b"job") == b"running"]
    assert [f[b"event"] for f in events] == [b"lost"]  # once
    assert not r.zcard("{jobd:q}:delayed") and not r.xlen("{jobd:q}:dead")  # not retried
    assert (tmp_path / "runs").read_text().split().count("running") == 1
