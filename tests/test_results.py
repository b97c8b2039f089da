"""Results and waiting (issue 34): a handler's JOBD_RESULT file, recorded with its done outcome
only; `jobd enqueue --wait` and ``producer.submit(...).wait()``; `jobd job` showing the result.
Real daemons, real handlers, the session's private Redis (and a 3-master cluster)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from support import DaemonProcess, LocalCluster, SentinelGroup, jobd_cli, wait_until

from jobd import producer
from jobd.config import load
from jobd.newjob import NewJob
from jobd.store.records import parse_records

Daemon = Callable[..., DaemonProcess]
HISTORY = "{jobd:q}:history"

# Echoes its payload back as its result (any bytes), prefixed.
ECHO = """\
#!/bin/sh
printf 'got:' > "$JOBD_RESULT"
cat >> "$JOBD_RESULT"
"""


def config(write_config, command: Path | str, **settings: object) -> Path:
    lines = "".join(f"    {k}: {v}\n" for k, v in settings.items())
    return write_config(
        "redis: {url: '{redis}'}\nqueues:\n  q:\n"
        f"    command: [{command}]\n    retry: {{max_attempts: 2, backoff: 10ms}}\n" + lines
    )


def records(r: redis.Redis, job_id: str) -> list[dict]:
    found, _ = parse_records(r.hget(HISTORY, job_id))
    return [rec.raw for rec in found]


def waiting(cfg: Path, *args: str) -> subprocess.Popen[bytes]:
    """`jobd enqueue … --wait` in the background."""
    return subprocess.Popen(
        [sys.executable, "-m", "jobd", "enqueue", "-c", str(cfg), "q", *args, "--wait"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_enqueue_wait_prints_the_result_and_exits_0_and_jobd_job_shows_it(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    cfg = config(write_config, script("echo.sh", ECHO))
    daemon(cfg)
    out = jobd_cli("enqueue", "-c", str(cfg), "q", "hello", "--job-id", "j1", "--wait",
                   "--wait-timeout", "30s")  # fmt: skip
    assert (out.returncode, out.stdout) == (0, b"got:hello"), out.stderr
    done = records(r, "j1")[-1]
    assert (done["event"], done["result"]) == ("done", "got:hello")
    shown = jobd_cli("job", "-c", str(cfg), "q", "j1", "--json")
    assert json.loads(shown.stdout)["result"] == "got:hello"
    text = jobd_cli("job", "-c", str(cfg), "q", "j1").stdout.decode()
    assert "  result:\n    got:hello" in text
    # --json: one document for the end, the result in it.
    as_json = jobd_cli("enqueue", "-c", str(cfg), "q", "again", "--wait", "--json")
    doc = json.loads(as_json.stdout)
    assert (as_json.returncode, doc["ended"], doc["result"]) == (0, "done", "got:again")


def test_a_result_sent_with_jobd_notify_is_what_enqueue_wait_prints(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    """A sh handler sends its result on its channel (``jobd notify --result``: X_JOBD_RESULT);
    it is taken over a file written as well (the channel's counts), recorded with ``done``,
    and ``enqueue --wait`` prints it and exits 0."""
    root = Path(__file__).resolve().parent.parent
    handler = script("h.sh", f"""\
        #!/bin/sh
        echo 'from the file' > "$JOBD_RESULT"
        PYTHONPATH={root} {sys.executable} -m jobd notify --result "the answer: $(cat)"
    """)  # fmt: skip
    cfg = config(write_config, handler)
    daemon(cfg)
    out = jobd_cli("enqueue", "-c", str(cfg), "q", "42", "--job-id", "told", "--wait",
                   "--wait-timeout", "30s")  # fmt: skip
    assert (out.returncode, out.stdout) == (0, b"the answer: 42"), out.stderr
    done = records(r, "told")[-1]
    assert (done["event"], done["result"]) == ("done", "the answer: 42")
    assert producer.submit(load(str(cfg)), "q", NewJob(b"7")).wait(30) == b"the answer: 7"


def test_a_failed_attempt_s_result_is_never_recorded(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    """Attempt 1 writes a result and fails; attempt 2 succeeds with none: the job is done with
    no result (the file of attempt 1 was removed, not read)."""
    handler = script("h.sh", """\
        #!/bin/sh
        printf 'attempt %s' "$JOBD_ATTEMPT" > "$JOBD_RESULT"
        [ "$JOBD_ATTEMPT" = 2 ] && rm "$JOBD_RESULT"
        [ "$JOBD_ATTEMPT" = 2 ]
    """)  # fmt: skip
    cfg = config(write_config, handler)
    daemon(cfg)
    out = jobd_cli("enqueue", "-c", str(cfg), "q", "x", "--job-id", "j2", "--wait")
    assert (out.returncode, out.stdout) == (0, b""), out.stderr
    events = [(rec["event"], "result" in rec or "result_base64" in rec) for rec in records(r, "j2")]
    assert events == [("retried", False), ("promoted", False), ("done", False)]
    assert json.loads(jobd_cli("job", "-c", str(cfg), "q", "j2", "--json").stdout)["result"] is None


def test_a_dead_lettered_job_exits_5_its_result_unrecorded(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    handler = script("h.sh", '#!/bin/sh\necho partial > "$JOBD_RESULT"\nexit 3\n')
    cfg = config(write_config, handler)
    daemon(cfg)
    out = jobd_cli("enqueue", "-c", str(cfg), "q", "x", "--job-id", "dead", "--wait")
    assert (out.returncode, out.stdout) == (5, b""), out.stderr
    assert b"ended dead-lettered (error: exit)" in out.stderr
    assert not any("result" in rec for rec in records(r, "dead"))
    # The Python API: JobFailed, with how it ended.
    with pytest.raises(producer.JobFailed) as failed:
        producer.submit(load(str(cfg)), "q", NewJob(b"y")).wait(30)
    ended = failed.value.ended
    assert (ended.event, ended.fields["error"]) == ("dead-lettered", "exit")


def test_a_result_over_result_max_fails_the_attempt_at_once(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    cfg = config(write_config, script("echo.sh", ECHO), result_max=16)
    daemon(cfg)
    out = jobd_cli("enqueue", "-c", str(cfg), "q", "1234567890123", "--job-id", "big", "--wait")
    assert (out.returncode, out.stdout) == (5, b""), out.stderr
    (dead,) = records(r, "big")  # no retry: its work was done
    assert (dead["event"], dead["error"], dead["exit_code"]) == ("dead-lettered", "result", 0)
    assert dead["detail"] == "result too large: 17 bytes, more than result_max (16)"
    letter = r.xrange("{jobd:q}:dead")[-1][1]
    assert b"result too large" in letter[b"jobd_stderr"]
    ok = jobd_cli("enqueue", "-c", str(cfg), "q", "123456789012", "--wait")  # 16 bytes: fits
    assert (ok.returncode, ok.stdout) == (0, b"got:123456789012")


def test_a_result_file_that_is_a_link_is_refused(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """A symbolic link (or a hard link) to a file the daemon can read is never recorded."""
    secret = tmp_path / "secret"
    secret.write_text("daemon's own")
    handler = script("h.sh", f"""\
        #!/bin/sh
        if [ "$(cat)" = soft ]; then ln -s {secret} "$JOBD_RESULT"; else ln {secret} "$JOBD_RESULT"; fi
    """)  # fmt: skip
    cfg = config(write_config, handler)
    daemon(cfg)
    for how in ("soft", "hard"):
        out = jobd_cli("enqueue", "-c", str(cfg), "q", how, "--job-id", how, "--wait")
        assert (out.returncode, out.stdout) == (5, b""), (how, out.stderr)
        dead = records(r, how)[-1]
        assert (dead["error"], "result" in dead) == ("result", False), how
        assert "daemon's own" not in json.dumps(records(r, how))


def test_non_utf8_result_bytes_round_trip(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    cfg = config(write_config, script("echo.sh", ECHO))
    daemon(cfg)
    raw = bytes(range(256))
    pending = producer.submit(load(str(cfg)), "q", NewJob(raw, "bin"))
    assert pending.wait(30) == b"got:" + raw
    assert "result_base64" in records(r, "bin")[-1]  # kept exactly, whatever the bytes
    out = jobd_cli("enqueue", "-c", str(cfg), "q", "--payload-file", "/dev/stdin", "--wait",
                   stdin=b"\xff\xfe caf\xc3\xa9")  # fmt: skip
    assert out.stdout == b"got:\xff\xfe caf\xc3\xa9"
    shown = json.loads(jobd_cli("job", "-c", str(cfg), "q", "bin", "--json").stdout)["result"]
    assert shown.startswith("got:\x00\x01") and "\\xff" in shown  # shown escaped


def test_cancelled_exits_6(write_config, script, daemon: Daemon) -> None:
    cfg = config(write_config, script("echo.sh", ECHO))
    waiter = waiting(cfg, "x", "--job-id", "later", "--delay", "1h")
    wait_until(lambda: jobd_cli("job", "-c", str(cfg), "q", "later").returncode == 0,
               what="the job delayed")  # fmt: skip
    assert jobd_cli("cancel", "-c", str(cfg), "q", "later").returncode == 0
    _, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 6, err


def test_expired_exits_7(r: redis.Redis, write_config, script, daemon: Daemon) -> None:
    cfg = config(write_config, script("echo.sh", ECHO))
    waiter = waiting(cfg, "x", "--expires-in", "200ms")
    wait_until(lambda: r.xlen("jobd:q") == 1, what="the job enqueued")
    entry = int(r.xrange("jobd:q")[0][0].split(b"-")[0])
    wait_until(lambda: r.time()[0] * 1000 > entry + 300, what="its expiry past on Redis's clock")
    daemon(cfg)
    _, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 7, err


def test_the_wait_times_out_with_124(write_config, script) -> None:
    cfg = config(write_config, script("echo.sh", ECHO))  # no daemon: it never ends
    out = jobd_cli("enqueue", "-c", str(cfg), "q", "x", "--wait", "--wait-timeout", "300ms")
    assert (out.returncode, out.stdout) == (124, b""), out.stderr
    bulk = jobd_cli("enqueue", "-c", str(cfg), "q", "--lines", "-", "--wait", stdin=b"a\n")
    assert bulk.returncode == 2 and b"--wait waits for one job" in bulk.stderr
    with pytest.raises(producer.WaitTimeout):
        producer.submit(load(str(cfg)), "q", NewJob(b"y")).wait(0.2)


def test_an_end_before_the_wait_starts_is_not_missed(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    """The job ends before ``wait`` is called: the events read are those after the mark taken
    before the enqueue, so its end is found; an earlier job of the same id is not taken."""
    cfg = config(write_config, script("echo.sh", ECHO))
    daemon(cfg)
    config_ = load(str(cfg))
    assert producer.submit(config_, "q", NewJob(b"one", "same")).wait(30) == b"got:one"
    pending = producer.submit(config_, "q", NewJob(b"two", "same"))
    wait_until(lambda: len([x for x in records(r, "same") if x["event"] == "done"]) == 2,
               what="the second run done")  # fmt: skip
    assert pending.wait(5) == b"got:two"


# Echoes its payload back as its result, prefixed; a payload starting 'slow' takes 2 s first.
SLOW_ECHO = """\
#!/bin/sh
payload=$(cat)
case "$payload" in slow*) sleep 2;; esac
printf 'got:%s' "$payload" > "$JOBD_RESULT"
"""


def slow_echo(write_config, script, **settings: object) -> Path:
    return config(write_config, script("slow.sh", SLOW_ECHO), **settings)


def test_a_wait_whose_end_event_was_trimmed_finds_it_in_the_history(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    """submit() now, wait() later (the Python API's pattern for many jobs): by the time the
    waiter reads, the events stream (MAXLEN ~ history.events) no longer has its job's end; the
    wait finds it in the job's history (review 6: it blocked until its timeout)."""
    cfg = slow_echo(write_config, script, history="{events: 20}", concurrency=4)
    daemon(cfg)
    config_ = load(str(cfg))
    pending = producer.submit(config_, "q", NewJob(b"first", "first"))
    for i in range(300):
        producer.enqueue_job(config_, "q", NewJob(b"x", f"other-{i}"))
    wait_until(lambda: r.hexists(HISTORY, "other-299"), 60, "the others done")
    assert r.hexists(HISTORY, "first")  # done, its record kept
    assert pending.wait(5) == b"got:first"


def test_a_wait_ends_with_its_own_job_not_an_earlier_one_of_its_job_id(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    """A job id still running when a new job of that id is submitted: the earlier one's end
    comes after the mark, and is not this wait's (review 6: it was taken, with its result)."""
    d = daemon(cfg := slow_echo(write_config, script))
    config_ = load(str(cfg))
    producer.enqueue_job(config_, "q", NewJob(b"slow-one", "same"))
    d.wait_log("job=same attempt=1 started")
    pending = producer.submit(config_, "q", NewJob(b"two", "same"))
    assert pending.wait(30) == b"got:two"


def test_a_wait_follows_its_job_through_its_retries(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Each retry is a new entry: the wait knows its job's later attempts by the entry its
    enqueue added (jobd_origin), and takes their end for its own."""
    once = tmp_path / "failed-once"
    handler = script("flaky.sh", f"#!/bin/sh\ntest -e {once} || {{ touch {once}; exit 1; }}\n"
                     'printf again > "$JOBD_RESULT"\n')  # fmt: skip
    daemon(cfg := config(write_config, handler))
    pending = producer.submit(load(str(cfg)), "q", NewJob(b"x", "flaky"))
    assert pending.wait(30) == b"again"
    assert [x["event"] for x in records(r, "flaky")] == ["retried", "promoted", "done"]


def test_a_wait_on_a_job_the_queue_dedupes_ends_with_the_earlier_result(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    """A queue with a dedupe window acknowledges, unrun, a new entry of a job id done within
    the window: an idempotent re-send with --wait ends 'deduped', exit 0, with the earlier
    run's result (review 6: it waited forever, no event being written)."""
    cfg = slow_echo(write_config, script, dedupe="{window: 1h}")
    daemon(cfg)
    config_ = load(str(cfg))
    assert producer.submit(config_, "q", NewJob(b"one", "same")).wait(30) == b"got:one"
    ended = producer.submit(config_, "q", NewJob(b"one", "same")).outcome(10)
    assert (ended.event, ended.done, ended.result) == ("deduped", True, b"got:one")
    out = jobd_cli("enqueue", "-c", str(cfg), "q", "one", "--job-id", "same", "--wait",
                   "--wait-timeout", "10s")  # fmt: skip
    assert (out.returncode, out.stdout) == (0, b"got:one"), out.stderr
    assert [x["event"] for x in records(r, "same")] == ["done", "deduped", "deduped"]


def test_a_history_key_of_another_type_is_one_line_and_exit_1(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    """Someone else's key at the history's name: the job's end comes (its event), its result
    cannot be read: one line, exit 1 (review 6: a traceback)."""
    r.set(HISTORY, "not a hash")
    daemon(cfg := config(write_config, script("echo.sh", ECHO)))
    out = jobd_cli("enqueue", "-c", str(cfg), "q", "x", "--wait", "--wait-timeout", "10s")
    assert out.returncode == 1 and b"Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.splitlines()) == 1 and b"WRONGTYPE" in out.stderr, out.stderr


def test_enqueue_wait_on_a_three_master_cluster(
    cluster: LocalCluster, script, daemon: Daemon, tmp_path: Path
) -> None:
    handler = script("echo.sh", ECHO)
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(
        "redis:\n  cluster:\n    nodes: [" + ", ".join(cluster.nodes[:2]) + "]\n"
        f"queues:\n  a: {{command: [{handler}], stream: 'media:a'}}\n"
        f"  b: {{command: [{handler}], stream: 'media:b'}}\n"
    )
    daemon(cfg)
    for queue in ("a", "b"):
        out = jobd_cli("enqueue", "-c", str(cfg), queue, f"on {queue}", "--wait",
                       "--wait-timeout", "30s")  # fmt: skip
        assert (out.returncode, out.stdout) == (0, f"got:on {queue}".encode()), out.stderr


def test_enqueue_wait_through_sentinel(script, daemon: Daemon, tmp_path: Path) -> None:
    """The wait reads what the settling script writes on the master Sentinel names: a result
    printed and exit 0, and a dead-lettered job's exit 5, as on one server."""
    group = SentinelGroup(tmp_path / "servers")
    group.start()
    try:
        handler = script(
            "h.sh", '#!/bin/sh\n[ "$(cat)" = bad ] && exit 64\nprintf ok > "$JOBD_RESULT"\n'
        )
        cfg = tmp_path / "sentinel.yaml"
        cfg.write_text(
            f"redis:\n  sentinel: {{master: {group.name}, nodes: [{', '.join(group.nodes)}]}}\n"
            f"queues:\n  q: {{command: [{handler}], exit_codes: {{fail: [64]}}}}\n"
        )
        daemon(cfg)
        out = jobd_cli("enqueue", "-c", str(cfg), "q", "good", "--wait", "--wait-timeout", "30s")
        assert (out.returncode, out.stdout) == (0, b"ok"), out.stderr
        out = jobd_cli("enqueue", "-c", str(cfg), "q", "bad", "--wait", "--wait-timeout", "30s")
        assert (out.returncode, out.stdout) == (5, b""), out.stderr
    finally:
        group.stop()
