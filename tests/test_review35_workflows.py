"""Review of issue 35 (workflows): defects it confirmed, each reproduced through real daemons on
the session's private Redis (failed before their fix)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from support import RedisServer, answers_busy, jobd_cli, wait_until, waiter_lines
from test_after_batches import (
    CALLBACK,
    RUNS,
    batch_yaml,
    callbacks,
    cli,
    events,
    queues_yaml,
    records,
    runs,
)

from jobd.config import load
from jobd.store.store import Store
from jobd.store.workflows import waiter_line


def test_a_garbage_outbox_entry_wedges_every_notice_behind_it(
    r: redis.Redis, write_config, script, daemon, tmp_path: Path
) -> None:
    """One outbox entry with kind=release and no dep (someone else's XADD, a half-written
    entry): move_notices raises KeyError before its try, so the whole round fails, nothing is
    XDELed, and every later notice of the queue (dependencies, batch counts) waits for ever."""
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    a = load(str(cfg)).queues["a"].keys
    r.xadd(a.outbox, {"kind": "release", "junk": "\xff"})  # garbage at the head
    daemon(cfg)
    cli(cfg, "enqueue", "a", "w", "--job-id", "w", "--after", "x")
    cli(cfg, "enqueue", "a", "x", "--job-id", "x")
    wait_until(lambda: "x" in runs(tmp_path), what="x ran")
    # Expected: w released and run once x is done (the garbage entry skipped or set aside).
    wait_until(
        lambda: "done" in events(records(r, "jobd:a", "w")),
        15,
        what="w released past a garbage outbox entry",
    )


def test_a_job_after_itself_is_refused(
    r: redis.Redis, write_config, script, daemon, tmp_path: Path
) -> None:
    """`--after` its own job id: hold.lua writes its record 'waiting' first, so wait_on.lua finds
    it not ended and registers it with itself; it can never run, yet jobd enqueue exits 0
    (jobd.workflows.dependencies checks the queue and the id, not the job itself)."""
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    out = jobd_cli("enqueue", "-c", str(cfg), "a", "p", "--job-id", "w", "--after", "w")
    held = r.hexists("{jobd:a}:held", "w")
    waits_on_itself = any(b'"job":"w"' in x for x in waiter_lines(r, "{jobd:a}:waiters", "w"))
    # Expected: a usage error (exit 2), nothing held.
    assert out.returncode == 2 and not held, (out.returncode, held, waits_on_itself)


def outbox_moved(r: redis.Redis, cfg: Path, queue: str = "a") -> bool:
    outbox = load(str(cfg)).queues[queue].keys.outbox
    return not r.exists(outbox) or r.xlen(outbox) == 0


def test_a_batch_id_used_again_after_its_batch_expired_calls_back_again(
    r: redis.Redis, write_config, script, daemon, tmp_path: Path
) -> None:
    """The callback's once-only mark was `{cb}:follow-up:batch|ID`, kept 7 days, while the
    batch's own keys expire with the history's max_age: a batch of the same id made after the
    first one expired found the first one's mark and never called back."""
    short = "    history: {max_age: 3s}\n"  # the batch's keys expire 3 s after its latest change
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK), short))  # fmt: skip
    daemon(cfg)
    cli(cfg, "enqueue", "a", "one", "--job-id", "one", "--batch", "B", "--on-complete", "cb")
    wait_until(lambda: len(callbacks(tmp_path)) == 1, what="the first batch's callback")
    wait_until(lambda: not r.exists("{jobd:batch:B}"), what="the first batch expired")
    cli(cfg, "enqueue", "a", "two", "--job-id", "two", "--batch", "B", "--on-complete", "cb")
    wait_until(lambda: "two" in runs(tmp_path) and outbox_moved(r, cfg), what="two counted")
    # Expected: batch B again, complete, with a callback of its own.
    wait_until(lambda: len(callbacks(tmp_path)) == 2, 10, what="the second batch's callback")
    one = {"batch": "B", "state": "complete", "total": 1, "done": 1, "failed": 0, "pending": 0}
    assert callbacks(tmp_path) == [one, one]
    # Still once for each: the second batch's callback sent again (a mover that died after it,
    # a lost reply) finds its own mark.
    store = Store(r)
    state = store.batch_op("B", "show")
    assert state is not None and state.state == "complete"
    assert store.callback(state) is False
    assert r.xlen("jobd:cb") == 2


def test_two_jobs_of_one_job_id_in_a_batch_are_two_members(
    r: redis.Redis, write_config, script, daemon, tmp_path: Path
) -> None:
    """Members' ends were counted by `QUEUE JOB_ID`: two jobs of one job id in a batch (two
    lines of --ndjson, two enqueues with one --job-id) made a total of 2 that the one member
    counted could never reach: the batch never completed, no callback."""
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    lines = b'{"payload": "p1", "job_id": "same"}\n{"payload": "p2", "job_id": "same"}\n'
    cli(cfg, "enqueue", "a", "--ndjson", "-", "--batch", "N", "--on-complete", "cb", stdin=lines)
    cli(cfg, "enqueue", "a", "p3", "--job-id", "twice", "--batch", "E", "--on-complete", "cb")
    cli(cfg, "enqueue", "a", "p4", "--job-id", "twice", "--batch", "E")
    daemon(cfg)  # after the enqueues: no member ends before the last is added

    def ended() -> bool:
        done = [events(records(r, "jobd:a", j)).count("done") for j in ("same", "twice")]
        return done == [2, 2] and outbox_moved(r, cfg)

    wait_until(ended, what="the four jobs done and their ends moved")
    shown = {b: json.loads(cli(cfg, "batch", b, "--json")) for b in ("N", "E")}
    # Expected: each batch complete, its two jobs two members, each counted once.
    for b in ("N", "E"):
        assert shown[b] == {"batch": b, "state": "complete", "total": 2, "done": 2,
                            "failed": 0, "pending": 0, "on_complete": "cb"}, shown  # fmt: skip
    wait_until(lambda: len(callbacks(tmp_path)) == 2, what="the two callbacks")
    got = sorted(callbacks(tmp_path), key=lambda c: c["batch"])
    assert [(c["batch"], c["total"], c["done"]) for c in got] == [("E", 2, 2), ("N", 2, 2)]


# Logs its start and end into "log" beside it; payload "hold" runs until the file "go" exists.
GATED = """\
#!/bin/sh
p=$(cat)
d=$(dirname "$0")
echo "start $JOBD_JOB_ID" >> "$d/log"
if [ "$p" = hold ]; then
  while [ ! -e "$d/go" ]; do sleep 0.02; done
fi
echo "end $JOBD_JOB_ID" >> "$d/log"
"""


def log(tmp_path: Path) -> list[str]:
    path = tmp_path / "log"
    return path.read_text().splitlines() if path.exists() else []


def test_after_a_job_that_runs_again_waits_for_that_run(
    r: redis.Redis, write_config, script, daemon, tmp_path: Path
) -> None:
    """wait_on.lua read only the latest history record of the job waited for: job x done once
    and running again now (enqueued again under its id) released a job `--after x` at once,
    while x's second run had not ended."""
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + queues_yaml(script("gated.sh", GATED), script("cb.sh", CALLBACK)))  # fmt: skip
    daemon(cfg)
    cli(cfg, "enqueue", "a", "", "--job-id", "x")
    wait_until(lambda: "done" in events(records(r, "jobd:a", "x")), what="x's first run done")
    cli(cfg, "enqueue", "a", "hold", "--job-id", "x")
    wait_until(lambda: ": running on" in cli(cfg, "job", "a", "x"), what="x running again")
    cli(cfg, "enqueue", "a", "w", "--job-id", "w", "--after", "x")
    # Expected: w held until x's run now ends.
    assert events(records(r, "jobd:a", "w")) == ["waiting"]
    assert "waiting for 1 of 1: a x" in cli(cfg, "job", "a", "w")
    (tmp_path / "go").touch()
    wait_until(lambda: "done" in events(records(r, "jobd:a", "w")), what="w done")
    assert log(tmp_path) == ["start x", "end x", "start x", "end x", "start w", "end w"]
    assert events(records(r, "jobd:a", "w")) == ["waiting", "released", "done"]


def test_after_a_unique_job_enqueued_again_waits_for_that_run(
    r: redis.Redis, write_config, script, daemon, tmp_path: Path
) -> None:
    """The same for a job enqueued again with --unique that no daemon has read yet (none runs):
    its mark says 'queued', so the end of that run is the one waited for."""
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + queues_yaml(script("gated.sh", GATED), script("cb.sh", CALLBACK)))  # fmt: skip
    d = daemon(cfg)
    cli(cfg, "enqueue", "a", "", "--job-id", "x", "--unique")
    wait_until(lambda: "done" in events(records(r, "jobd:a", "x")), what="x's first run done")
    d.stop()
    cli(cfg, "enqueue", "a", "", "--job-id", "x", "--unique")
    cli(cfg, "enqueue", "a", "w", "--job-id", "w", "--after", "x")
    # Expected: w held until x's run now ends.
    assert events(records(r, "jobd:a", "w")) == ["waiting"]
    daemon(cfg)
    wait_until(lambda: "done" in events(records(r, "jobd:a", "w")), what="w done")
    assert log(tmp_path) == ["start x", "end x", "start x", "end x", "start w", "end w"]


def test_a_stale_or_hostile_running_record_holds_no_waiter(
    r: redis.Redis, write_config, script
) -> None:
    """A running record a daemon killed -9 left behind (its entry settled since) is not
    believed: a job done and not running counts at once. Keys of another type where the running
    records and the --unique mark live (someone else's) fail nothing."""
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + queues_yaml(script("gated.sh", GATED), script("cb.sh", CALLBACK)))  # fmt: skip
    a = load(str(cfg)).queues["a"]
    done = b'{"at":1,"event":"done"}'
    r.xgroup_create("jobd:a", "jobd", id="0", mkstream=True)
    entry = r.xadd("jobd:a", {"payload": "", "job_id": "x"})
    r.hset(a.keys.history, mapping={"x": done, "y": done, "z": done})
    r.hset(a.keys.active, "x", b"jobd:a|" + entry + b'\n{"consumer":"gone","pid":1}')  # not pending
    r.hset(a.keys.active, "y", b"garbage \xff|||\n")
    store = Store(r)
    assert store.wait_on(a, "x", waiter_line(a, "w")) == ("done", "done")
    assert store.wait_on(a, "y", waiter_line(a, "w")) == ("done", "done")
    r.delete(a.keys.active)
    r.set(a.keys.active, "someone else's")
    r.hset(a.keys.job_mark("z"), "not", "a mark")
    assert store.wait_on(a, "z", waiter_line(a, "w")) == ("done", "done")
    assert not r.exists(a.keys.waiters)
    r.delete(a.keys.history)
    r.set(a.keys.history, "someone else's")
    assert store.wait_on(a, "x", waiter_line(a, "w")) is None  # no record: waits
    assert waiter_lines(r, a.keys.waiters, "x") == [waiter_line(a, "w")]


def test_the_last_record_of_a_long_history_is_found_without_blocking_redis(
    r: redis.Redis, redis_server: RedisServer, write_config, script
) -> None:
    """wait_on.lua took a job's last record with an unanchored pattern ('[^\\n]*$'), tried from
    every byte of the history and each try running to its line's end: quadratic in a record's
    length. One record of 50 KB before the last (a history keeps 64 KiB of a job's records)
    blocked Redis for about 20 s, and no SCRIPT KILL reaches a script inside string.match."""
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + queues_yaml(script("gated.sh", GATED), script("cb.sh", CALLBACK)))  # fmt: skip
    a = load(str(cfg)).queues["a"]
    r.hset(a.keys.history, "x", b'{"event":"retried","stdout":"' + b"x" * 50_000 + b'"}\n'
           b'{"at":1,"event":"done"}')  # fmt: skip
    r.config_set("busy-reply-threshold", 100)
    quick = redis.Redis(port=redis_server.port, socket_timeout=3, retry=Retry(NoBackoff(), 0))
    try:
        ended = Store(quick).wait_on(a, "x", waiter_line(a, "w"))
    except redis.TimeoutError:
        pytest.fail("wait_on.lua ran 3 s on one history of 50 KB")
    finally:
        with contextlib.suppress(redis.ResponseError):  # NOTBUSY: it ended
            r.script_kill()
        wait_until(lambda: not answers_busy(r), 60, what="Redis to answer again")
        r.config_set("busy-reply-threshold", 5000)
        quick.close()
    assert ended == ("done", "done")


def test_a_batch_key_of_another_type_fails_nothing_half_way(
    r: redis.Redis, write_config, script
) -> None:
    """batch.lua's count marked the notice counted (SADD) before it failed on a batch hash
    that is someone else's key: a script that fails after a write. Now such a batch is none:
    the notice is dropped as one of an expired batch's, nothing written; an enqueue into it is
    refused before anything is written."""
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    r.set("{jobd:batch:H}", "someone else's")
    notice = {b"kind": b"batch", b"batch": b"H", b"member": b"a j", b"outcome": b"done",
              b"event": b"done"}  # fmt: skip
    assert Store(r).move_notices("{jobd:a}:outbox", [(b"1-1", notice)]) == ([b"1-1"], None)
    assert not r.exists("{jobd:batch:H}:members")
    out = jobd_cli("enqueue", "-c", str(cfg), "a", "p", "--batch", "H")
    assert out.returncode == 2 and b"is not a batch" in out.stderr, out.stderr
    assert r.xlen("jobd:a") == 0 and r.get("{jobd:batch:H}") == b"someone else's"
