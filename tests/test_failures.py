"""The failure policy: outcomes, retries with backoff, delayed jobs, dead letters, retention."""

from __future__ import annotations

import itertools
import json
import random
import signal
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import redis
from support import (
    DaemonProcess,
    acked_all,
    group_info,
    jobd_cli,
    kill_with_handlers,
    pending_count,
    wait_group,
    wait_until,
)

from jobd import producer
from jobd.config import Retry, load
from jobd.daemon import delayed
from jobd.job import Job
from jobd.outcome import Verb
from jobd.process import policy
from jobd.process.handler import ExitStatus, StopReason
from jobd.store.store import Store

Daemon = Callable[..., DaemonProcess]


# -- the policy itself ---------------------------------------------------------------------------


@pytest.fixture
def queue(tmp_path: Path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "queues:\n  q:\n    command: [/bin/true]\n"
        "    retry: {max_attempts: 3, backoff: 1s, max_backoff: 3s, jitter: 0}\n"
        "    exit_codes: {fail: [65]}\n"
    )
    return load(str(path)).queues["q"]


@pytest.mark.parametrize(
    ("status", "attempt", "action", "error"),
    [
        (ExitStatus(0, None, False), 1, Verb.ACK, None),
        (ExitStatus(65, None, False), 1, Verb.DEAD_LETTER, "exit"),
        (ExitStatus(1, None, False), 1, Verb.RETRY, "exit"),
        (ExitStatus(75, None, False), 2, Verb.RETRY, "exit"),
        (ExitStatus(1, None, False), 3, Verb.DEAD_LETTER, "exit"),
        (ExitStatus(None, 9, False), 1, Verb.RETRY, "signal"),
        (ExitStatus(None, 15, True), 1, Verb.RETRY, "timeout"),
        (ExitStatus(None, 15, True), 3, Verb.DEAD_LETTER, "timeout"),
        (None, 1, Verb.RETRY, "spawn"),
        (None, 3, Verb.DEAD_LETTER, "spawn"),
    ],
)
def test_outcome_table(queue, status, attempt, action, error) -> None:
    job = Job("q", "1-0", {b"payload": b"x"}, "job-1", attempt)
    outcome = policy.decide(queue, job, status)
    assert (outcome.verb, outcome.error) == (action, error)


def test_shutdown_and_lease_loss_are_not_failures(queue) -> None:
    failed = ExitStatus(None, 15, False)
    job = Job("q", "1-0", {b"payload": b"x"}, "job-1", 1)
    assert policy.decide(queue, job, failed, StopReason.SHUTDOWN).verb is Verb.HAND_BACK
    assert policy.decide(queue, job, failed, StopReason.LEASE_LOST).verb is Verb.RELEASE


def test_backoff_formula() -> None:
    retry = Retry(max_attempts=10, backoff=1.0, max_backoff=10.0, jitter=0.0)
    rng = random.Random(1)
    assert [policy.backoff_delay(retry, n, rng) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    jittery = Retry(max_attempts=10, backoff=1.0, max_backoff=600, jitter=0.2)
    delays = [policy.backoff_delay(jittery, 3, rng) for _ in range(1000)]
    assert 3.2 <= min(delays) < 3.3 and 4.7 < max(delays) <= 4.8
    assert policy.backoff_delay(jittery, 10_000, rng) <= 720


# -- a real daemon -------------------------------------------------------------------------------

MIXED = """
    #!{python}
    import json, os, subprocess, sys, time
    payload = sys.stdin.read()
    state = "{dir}/count." + payload
    n = int(open(state).read()) + 1 if os.path.exists(state) else 1
    open(state, "w").write(str(n))
    with open("{dir}/runs", "a") as f:
        f.write(json.dumps([payload, os.environ["JOBD_JOB_ID"], int(os.environ["JOBD_ATTEMPT"]),
                            time.time()]) + "\\n")
    if payload == "ok":
        sys.exit(0)
    if payload == "bad-input":
        print("cannot parse this", file=sys.stderr)
        sys.exit(65)
    if payload == "always":
        sys.stderr.write("x" * 10000 + "THE END")
        sys.exit(1)
    if payload == "tempfail":
        sys.exit(75)
    if payload == "flaky":
        sys.exit(0 if n >= 3 else 1)
    if payload == "hang":
        child = subprocess.Popen(["sleep", "300"])
        open("{dir}/grandchild." + str(n), "w").write(str(child.pid))
        time.sleep(300)
"""


def test_mixed_outcomes_in_one_run(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("mixed.py", MIXED.format(python=sys.executable, dir=tmp_path))
    config = write_config(
        """
        redis: {url: '{redis}'}
        queues:
          q:
            command: [./mixed.py]
            concurrency: 6
            timeout: 700ms
            kill_grace: 300ms
            retry: {max_attempts: 3, backoff: 300ms, max_backoff: 10s, jitter: 0}
        """
    )
    daemon(config)
    kinds = ["ok", "bad-input", "always", "tempfail", "flaky", "hang"]
    first_ids = {kind: r.xadd("jobd:q", {"payload": kind}).decode() for kind in kinds}
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 4, 60, "four dead letters")
    wait_until(lambda: pending_count(r, "jobd:q") == 0 and r.zcard("{jobd:q}:delayed") == 0)

    runs: dict[str, list] = defaultdict(list)
    for line in (tmp_path / "runs").read_text().splitlines():
        payload, job_id, attempt, at = json.loads(line)
        runs[payload].append((job_id, attempt, at))
    expected_attempts = {"ok": 1, "bad-input": 1, "always": 3, "tempfail": 3, "flaky": 3, "hang": 3}
    for kind, count in expected_attempts.items():
        assert [a for _, a, _ in runs[kind]] == list(range(1, count + 1)), kind
        assert {j for j, _, _ in runs[kind]} == {first_ids[kind]}, f"{kind}: a stable job id"

    # backoff × 2^(n−1): each failed attempt's record says when the next is due, on Redis's
    # clock: 300 ms after attempt 1 ended, 600 ms after attempt 2; and no attempt started before
    # it was due (how soon after is the forwarder's, tests/test_scheduling.py: a wall-time bound
    # here failed on a loaded machine, where a Python handler takes long to start).
    raw = r.hget("{jobd:q}:history", first_ids["always"])
    attempts = [x for x in map(json.loads, raw.split(b"\n")) if x["event"] != "promoted"]
    assert [x["event"] for x in attempts] == ["retried", "retried", "dead-lettered"], attempts
    assert [x["due"] - x["at"] for x in attempts[:2]] == [300, 600]
    for before, after in itertools.pairwise(attempts):
        assert after["started_at"] >= before["due"], (before, after)
    starts = [at for _, _, at in runs["always"]]
    for gap, delay in zip((b - a for a, b in itertools.pairwise(starts)), (0.3, 0.6), strict=True):
        assert gap >= delay, (gap, delay)

    records = {rec[b"jobd_job_id"].decode(): rec for _, rec in r.xrange("{jobd:q}:dead")}
    assert set(records) == {first_ids[k] for k in ("bad-input", "always", "tempfail", "hang")}
    bad = records[first_ids["bad-input"]]
    assert (bad[b"jobd_error"], bad[b"jobd_exit_code"], bad[b"jobd_attempts"]) == (
        b"exit",
        b"65",
        b"1",
    )
    assert bad[b"jobd_stderr"] == b"cannot parse this\n" and bad[b"payload"] == b"bad-input"
    always = records[first_ids["always"]]
    assert (always[b"jobd_error"], always[b"jobd_exit_code"], always[b"jobd_attempts"]) == (
        b"exit",
        b"1",
        b"3",
    )
    assert len(always[b"jobd_stderr"]) == 4096 and always[b"jobd_stderr"].endswith(b"THE END")
    assert records[first_ids["tempfail"]][b"jobd_exit_code"] == b"75"
    hang = records[first_ids["hang"]]
    assert (hang[b"jobd_error"], hang[b"jobd_signal"], hang[b"jobd_exit_code"]) == (
        b"timeout",
        b"15",
        b"",
    )
    assert hang[b"jobd_queue"] == b"q" and hang[b"jobd_original_id"].decode() != first_ids["hang"]
    assert int(hang[b"jobd_failed_at"]) / 1000 == pytest.approx(time.time(), abs=60)
    for n in (1, 2, 3):
        pid = int((tmp_path / f"grandchild.{n}").read_text())
        wait_until(lambda pid=pid: not psutil.pid_exists(pid), what=f"grandchild {n} gone")
    assert acked_all(r, "jobd:q", 6 + 2 + 2 + 2 + 2)


def test_two_daemons_move_1000_due_jobs_exactly_once(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", f"#!/bin/sh\necho $JOBD_JOB_ID >> {tmp_path}/ran\n")
    config = write_config(
        """
        redis: {url: '{redis}'}
        queues:
          q: {command: [./h.sh], concurrency: 8}
        """
    )
    cfg = load(str(config))
    store = Store(r)
    due = delayed.now_ms() + 1500
    for i in range(1000):
        store.schedule(cfg.queues["q"], {b"payload": b"x", b"job_id": f"d-{i}".encode()}, due)
    daemon(config), daemon(config)
    wait_until(lambda: acked_all(r, "jobd:q", 1000), 60, "all 1000 acked")
    ran = Counter((tmp_path / "ran").read_text().split())
    assert ran == Counter({f"d-{i}": 1 for i in range(1000)})
    assert r.zcard("{jobd:q}:delayed") == 0


def test_sigkill_during_heavy_retries_keeps_every_job_in_one_place(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script(
        "h.sh",
        f"#!/bin/sh\n[ $JOBD_ATTEMPT -ge 6 ] && echo $JOBD_JOB_ID >> {tmp_path}/done && exit 0\nexit 1\n",
    )
    config = write_config(
        """
        redis: {url: '{redis}'}
        queues:
          q:
            command: [./h.sh]
            concurrency: 8
            retry: {max_attempts: 7, backoff: 200ms, max_backoff: 1s, jitter: 0.5}
        """
    )
    # backoffs long enough that retries wait in the delayed set while 20 jobs get done, however
    # slow the machine (with 20 ms, a loaded daemon's retries were due before it got to them:
    # the delayed set stayed small, and "heavy retrying" was never seen)
    cfg = load(str(config))
    pipe = r.pipeline(transaction=False)
    for i in range(300):
        pipe.xadd("jobd:q", {"payload": "x", "job_id": f"j-{i}"})
    pipe.execute()
    d = daemon(config)

    def done_count() -> int:
        path = tmp_path / "done"
        return len(path.read_text().split()) if path.exists() else 0

    wait_until(
        lambda: done_count() >= 20 and r.zcard("{jobd:q}:delayed") > 20, what="heavy retrying"
    )
    kill_with_handlers(d)

    places: Counter[str] = Counter()
    group = group_info(r, "jobd:q")
    pending = {e["message_id"] for e in r.xpending_range("jobd:q", "jobd", "-", "+", 10_000)}

    def order(mid: bytes) -> tuple[int, ...]:
        return tuple(int(x) for x in mid.split(b"-"))

    for mid, fields in r.xrange("jobd:q"):
        if mid in pending or order(mid) > order(group["last-delivered-id"]):
            places[fields[b"job_id"].decode()] += 1
    for job in Store(r).delayed_list(cfg.queues["q"], 10_000):
        places[job.fields[b"job_id"].decode()] += 1
    for _, record in r.xrange("{jobd:q}:dead"):
        places[record[b"jobd_job_id"].decode()] += 1
    done = set((tmp_path / "done").read_text().split()) if (tmp_path / "done").exists() else set()
    print(
        f"after SIGKILL: {len(done)} done, {r.zcard('{jobd:q}:delayed')} delayed, "
        f"{r.xlen('{jobd:q}:dead')} dead-lettered"
    )
    everything = {f"j-{i}" for i in range(300)}
    assert set(places) | done == everything, "no job lost"
    for job in everything:
        # A job whose handler finished but whose ack the kill cut off is also still pending:
        # it runs again (at-least-once). Any other job is in exactly one place.
        assert places[job] == (places[job] if job in done else 1) and places[job] <= 1, job


def test_enqueue_with_delay_and_at(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", f'#!/bin/sh\necho "$JOBD_JOB_ID $(date +%s.%N)" >> {tmp_path}/ran\n')
    config = write_config("redis: {url: '{redis}'}\nqueues:\n  q: {command: [./h.sh]}\n")
    daemon(config)
    wait_group(r, "jobd:q")

    def scheduled(job_id: str) -> float:
        """The due time its "scheduled" record says (the delayed set may have promoted it by
        the time a loaded machine looks)."""
        first = r.hget("{jobd:q}:history", job_id).splitlines()[0]
        assert json.loads(first)["event"] == "scheduled", first
        return json.loads(first)["due"] / 1000

    before = time.time()
    delayed_run = jobd_cli("enqueue", "-c", str(config), "q", "later", "--delay", "1500ms")
    after = time.time()
    at = after + 3  # from now: a first enqueue slow on a loaded machine made it due already
    at_run = jobd_cli("enqueue", "-c", str(config), "q", "at", "--job-id", "fixed", "--at", str(at))
    assert delayed_run.returncode == 0 and at_run.stdout == b"fixed\n"
    job_id = delayed_run.stdout.decode().strip()
    assert len(job_id) == 32, "a delayed job gets a generated job id"
    due = {job_id: scheduled(job_id), "fixed": scheduled("fixed")}
    assert before + 1.5 <= due[job_id] <= after + 1.5
    assert due["fixed"] == pytest.approx(at, abs=0.001)
    wait_until(
        lambda: (
            (tmp_path / "ran").exists() and len((tmp_path / "ran").read_text().splitlines()) == 2
        )
    )
    ran = dict(line.split() for line in (tmp_path / "ran").read_text().splitlines())
    for job, when in due.items():
        assert when <= float(ran[job]) <= when + 0.5, (
            f"{job} started {float(ran[job]) - when:.3f}s late"
        )
    bad = jobd_cli("enqueue", "-c", str(config), "q", "x", "--at", "next tuesday")
    assert bad.returncode == 2 and b"ISO 8601" in bad.stderr


def test_dead_letter_stream_is_capped(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", "#!/bin/sh\nexit 65\n")
    config = write_config(
        "redis: {url: '{redis}'}\nqueues:\n  q: {command: [./h.sh], dead_letter: {maxlen: 3}}\n"
    )
    daemon(config)
    for i in range(6):
        r.xadd("jobd:q", {"payload": str(i)})
    wait_until(lambda: acked_all(r, "jobd:q", 6))
    wait_until(lambda: pending_count(r, "jobd:q") == 0)
    assert [rec[b"payload"] for _, rec in r.xrange("{jobd:q}:dead")] == [b"3", b"4", b"5"]


def test_dead_letter_max_age(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", "#!/bin/sh\nexit 65\n")
    config = write_config(
        "redis: {url: '{redis}'}\nqueues:\n  q: {command: [./h.sh], dead_letter: {max_age: 1s}}\n"
    )
    daemon(config)
    r.xadd("jobd:q", {"payload": "old"})
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 1)
    old_id = r.xrange("{jobd:q}:dead")[0][0]
    wait_until(lambda: time.time() * 1000 > int(old_id.split(b"-")[0]) + 1100, what="1 s to pass")
    r.xadd("jobd:q", {"payload": "new"})
    wait_until(lambda: [rec[b"payload"] for _, rec in r.xrange("{jobd:q}:dead")] == [b"new"])


def test_retention_keeps_pending_and_undelivered_entries(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    script(
        "h.sh",
        f'#!/bin/sh\n[ "$(cat)" = long ] || exit 0\nwhile [ ! -e {gate} ]; do sleep 0.05; done\n',
    )
    config = write_config(
        "redis: {url: '{redis}'}\nqueues:\n  q: {command: [./h.sh], concurrency: 4, retention: {maxlen: 20}}\n"
    )
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    r.xgroup_create("jobd:q", "analytics", id="0")
    ids = [r.xadd("jobd:q", {"payload": "long" if i == 2 else "quick"}) for i in range(500)]
    # Another application's group: it has read 450 entries and not acknowledged five of them.
    r.xreadgroup("analytics", "a1", {"jobd:q": ">"}, count=450)
    analytics_pending = ids[4:9]
    r.xack("jobd:q", "analytics", *[i for i in ids[:450] if i not in analytics_pending])
    daemon(config)
    wait_until(
        lambda: group_info(r, "jobd:q")["entries-read"] == 500 and pending_count(r, "jobd:q") == 1
    )
    # ids[449], analytics' last delivered entry, is kept while it is (review 36o: no tombstone)
    must_stay = {ids[2], *analytics_pending, *ids[449:]}
    wait_until(
        lambda: r.xlen("jobd:q") == len(must_stay), what=f"the stream trimmed to {len(must_stay)}"
    )
    assert {mid for mid, _ in r.xrange("jobd:q")} == must_stay
    gate.touch()
    wait_until(
        lambda: r.xlen("jobd:q") == len(must_stay) - 1,
        what="the long job's entry trimmed once acked",
    )


def test_dlq_list_show_requeue_purge(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script(
        "h.sh",
        f'#!/bin/sh\necho "$JOBD_JOB_ID $JOBD_ATTEMPT" >> {tmp_path}/ran\n'
        f'[ -e {tmp_path}/fixed ] && exit 0\necho "no such customer" >&2\nexit 65\n',
    )
    config = write_config("redis: {url: '{redis}'}\nqueues:\n  q: {command: [./h.sh]}\n")
    c = str(config)
    daemon(config)
    for i in range(3):
        producer.enqueue(load(c), "q", f"payload-{i}".encode(), job_id=f"order-{i}", client=r)
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 3)

    listing = jobd_cli("dlq", "-c", c, "q", "list").stdout.decode().splitlines()
    assert [line.split()[1] for line in listing] == ["job=order-2", "job=order-1", "job=order-0"]
    assert all("error=exit  exit=65  attempts=1  failed=20" in line for line in listing)

    shown = jobd_cli("dlq", "-c", c, "q", "show", "order-1").stdout.decode()
    assert "payload: payload-1" in shown and "jobd_stderr: no such customer" in shown
    record_id = listing[0].split()[0]
    assert "job_id: order-2" in jobd_cli("dlq", "-c", c, "q", "show", record_id).stdout.decode()
    assert jobd_cli("dlq", "-c", c, "q", "show", "nope").returncode == 3

    (tmp_path / "fixed").touch()
    requeued = jobd_cli("dlq", "-c", c, "q", "requeue", "order-0", record_id)
    assert requeued.stdout == b"requeued 2 job(s) to jobd:q\n"
    wait_until(lambda: (tmp_path / "ran").read_text().count("\n") == 5)
    assert sorted((tmp_path / "ran").read_text().splitlines()[3:]) == ["order-0 1", "order-2 1"]
    assert [rec[b"jobd_job_id"] for _, rec in r.xrange("{jobd:q}:dead")] == [b"order-1"]

    assert (
        jobd_cli("dlq", "-c", c, "q", "purge", "--yes").stdout
        == b"purged 1 dead letter(s) from {jobd:q}:dead\n"
    )
    assert r.xlen("{jobd:q}:dead") == 0
    assert jobd_cli("dlq", "-c", c, "q", "requeue").returncode == 2


def test_dlq_requeue_all(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", f"#!/bin/sh\n[ -e {tmp_path}/fixed ] && exit 0\nexit 65\n")
    config = write_config("redis: {url: '{redis}'}\nqueues:\n  q: {command: [./h.sh]}\n")
    daemon(config)
    for i in range(20):
        r.xadd("jobd:q", {"payload": str(i)})
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 20)
    (tmp_path / "fixed").touch()
    assert (
        jobd_cli("dlq", "-c", str(config), "q", "requeue", "--all").stdout
        == b"requeued 20 job(s) to jobd:q\n"
    )
    wait_until(lambda: acked_all(r, "jobd:q", 40) and pending_count(r, "jobd:q") == 0)
    assert r.xlen("{jobd:q}:dead") == 0


def test_sigterm_during_retry_wait_loses_nothing(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", f"#!/bin/sh\necho $JOBD_ATTEMPT >> {tmp_path}/ran\n[ $JOBD_ATTEMPT -ge 2 ]\n")
    config = write_config(
        "redis: {url: '{redis}'}\nqueues:\n  q:\n    command: [./h.sh]\n    retry: {backoff: 2s, jitter: 0}\n"
    )
    d = daemon(config)
    r.xadd("jobd:q", {"payload": "x"})
    wait_until(lambda: r.zcard("{jobd:q}:delayed") == 1)
    d.signal(signal.SIGTERM)
    assert d.proc.wait(30) == 0
    daemon(config)
    wait_until(lambda: (tmp_path / "ran").read_text().split() == ["1", "2"])
    wait_until(lambda: pending_count(r, "jobd:q") == 0 and r.zcard("{jobd:q}:delayed") == 0)


def test_handlers_that_cannot_start_are_retried_then_dead_lettered_as_spawn(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("bad_interpreter.sh", "#!/nonexistent/interpreter\nexit 0\n")
    script("no_shebang", "this is not a program\n")
    missing = script("missing.sh", "#!/bin/sh\n")
    config = write_config(
        """
        redis: {url: '{redis}'}
        defaults: {retry: {max_attempts: 2, backoff: 50ms}}
        queues:
          interpreter: {command: [./bad_interpreter.sh]}
          format: {command: [./no_shebang]}
          missing: {command: [./missing.sh]}
        """
    )
    daemon(config)
    missing.unlink()  # deleted after the config was validated: a bad deploy
    for name in ("interpreter", "format", "missing"):
        r.xadd(f"jobd:{name}", {"payload": "x"})
    reasons = {}
    for name in ("interpreter", "format", "missing"):
        wait_until(
            lambda name=name: r.xlen(f"{{jobd:{name}}}:dead") == 1, what=f"{name} dead-lettered"
        )
        [(_, record)] = r.xrange(f"{{jobd:{name}}}:dead")
        assert (record[b"jobd_error"], record[b"jobd_attempts"]) == (b"spawn", b"2")
        reasons[name] = record[b"jobd_stderr"].decode()
        assert pending_count(r, f"jobd:{name}") == 0
    assert "No such file or directory" in reasons["interpreter"]
    assert "Exec format error" in reasons["format"]
    assert "No such file or directory" in reasons["missing"]
