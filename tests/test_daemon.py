"""End to end: a real `jobd run` against a real Redis, with handlers in sh and Python."""

from __future__ import annotations

import os
import random
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import orjson
import psutil
import redis
from support import (
    DaemonProcess,
    acked_all,
    free_port,
    group_info,
    pending_count,
    queue_config,
    wait_group,
    wait_until,
)

Daemon = Callable[..., DaemonProcess]


def test_300_binary_and_non_ascii_jobs_run_exactly_once_with_exact_bytes(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    script(
        "record.py",
        f"""
        #!{sys.executable}
        import os, sys
        data = sys.stdin.buffer.read()
        mid = os.environ["JOBD_QUEUE"] + "-" + os.environ["JOBD_MESSAGE_ID"]
        with open("{out}/" + mid, "wb") as f:
            f.write(data)
        fd = os.open("{tmp_path}/runs.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, (mid + "\\n").encode())
        """,
    )
    script(
        "record.sh",
        f"""
        #!/bin/sh
        cat > "{out}/$JOBD_QUEUE-$JOBD_MESSAGE_ID"
        echo "$JOBD_QUEUE-$JOBD_MESSAGE_ID" >> "{tmp_path}/runs.log"
        """,
    )
    config = write_config(
        """
        redis: {url: '{redis}'}
        queues:
          py: {command: [./record.py], concurrency: 4}
          sh: {command: [./record.sh], concurrency: 3}
        """
    )
    rng = random.Random(7)
    samples = [
        b"",
        b"\x00",
        b"\xff\xfe\x00binary\n",
        "héllo wörld ✓ 日本語 🚀".encode(),
        b"\r\n\t ",
    ]
    sent: dict[str, bytes] = {}
    for i in range(300):
        payload = samples[i % len(samples)] + rng.randbytes(rng.randrange(0, 3000))
        queue = "py" if i % 2 else "sh"
        sent[f"{queue}-{r.xadd(f'jobd:{queue}', {'payload': payload}).decode()}"] = payload
    daemon(config)
    wait_until(
        lambda: acked_all(r, "jobd:py", 150) and acked_all(r, "jobd:sh", 150), 60, "all acked"
    )
    runs = (tmp_path / "runs.log").read_text().split()
    assert sorted(runs) == sorted(sent), "each job ran exactly once"
    for mid, payload in sent.items():
        assert (out / mid).read_bytes() == payload, mid
    assert pending_count(r, "jobd:py") == pending_count(r, "jobd:sh") == 0


def test_entry_without_payload_gets_json_of_its_fields(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", f"#!/bin/sh\ncat > {tmp_path}/stdin\n")
    daemon(write_config(queue_config("[./h.sh]")))
    r.xadd("jobd:q", {"user": "ada", "n": "1"})
    wait_until(lambda: acked_all(r, "jobd:q", 1))
    assert orjson.loads((tmp_path / "stdin").read_bytes()) == {"user": "ada", "n": "1"}


def test_handler_environment_argv_cwd_and_process_group(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    script(
        "h.py",
        f"""
        #!{sys.executable}
        import json, os, sys
        json.dump({{"env": dict(os.environ), "argv": sys.argv[1:], "cwd": os.getcwd(),
                   "pgid": os.getpgrp(), "sid": os.getsid(0), "pid": os.getpid()}}, open("{tmp_path}/seen.json", "w"))
        """,
    )
    config = write_config(
        queue_config(
            '[./h.py, "two words", "$HOME", "; rm -rf /"]',
            cwd="work",
            timeout="90s",
            env="{GREETING: hi, COUNT: 3}",
        )
    )
    d = daemon(
        config, env={"REDIS_PASSWORD": "s3cret", "NOTIFY_SOCKET": "/run/x", "LANG": "C.UTF-8"}
    )
    mid = r.xadd("jobd:q", {"payload": b"x", "job_id": "order-7"}).decode()
    wait_until(lambda: acked_all(r, "jobd:q", 1))
    seen = orjson.loads((tmp_path / "seen.json").read_bytes())
    env = seen["env"]
    assert seen["argv"] == ["two words", "$HOME", "; rm -rf /"]
    assert seen["cwd"] == str(work)
    assert seen["pgid"] == seen["sid"] == seen["pid"], "the handler leads its own session"
    assert env["JOBD_QUEUE"] == "q" and env["JOBD_STREAM"] == "jobd:q"
    assert env["JOBD_JOB_ID"] == "order-7" and env["JOBD_MESSAGE_ID"] == mid
    assert env["JOBD_ATTEMPT"] == "1" and env["JOBD_PAYLOAD_BYTES"] == "1"
    deadline = int(env["JOBD_DEADLINE"])
    assert 0 < deadline - int(mid.split("-")[0]) / 1000 <= 91
    assert env["GREETING"] == "hi" and env["COUNT"] == "3" and env["LANG"] == "C.UTF-8"
    assert "REDIS_PASSWORD" not in env
    # Its NOTIFY_SOCKET is jobd's own channel (issue 34), never the one jobd was given.
    assert re.fullmatch(r"@jobd/\d+/[0-9a-f]{16}", env["NOTIFY_SOCKET"]), env["NOTIFY_SOCKET"]
    assert set(env) <= {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "GREETING",
        "COUNT",
        "PWD",
        "NOTIFY_SOCKET",
    } | {k for k in env if k.startswith(("JOBD_", "LC_"))}
    assert "s3cret" not in d.log()


def test_handlers_start_with_default_signal_dispositions(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays ignored across exec: a
    handler must not inherit that (`producer | head -1` would then end with write errors
    instead of quietly). Nor signals the daemon was started with ignored (nohup, a shell's
    background job); SIGCHLD ignored would even reap handlers before the daemon could. Both
    ways of starting a handler are checked: in the daemon's folder (jobd/process/spawn.py) and in
    another one (subprocess)."""
    (tmp_path / "work").mkdir()
    script(
        "sigs.sh",
        f"#!/bin/sh\ngrep -E '^Sig(Ign|Blk):' /proc/self/status > {tmp_path}/sigs.$JOBD_QUEUE\n",
    )
    config = write_config(
        "redis: {url: '{redis}'}\n"
        "queues:\n"
        f"  here: {{command: [{tmp_path}/sigs.sh]}}\n"
        f"  elsewhere: {{command: [{tmp_path}/sigs.sh], cwd: work}}\n"
    )
    inherited = (signal.SIGQUIT, signal.SIGUSR2, signal.SIGTSTP, signal.SIGCHLD)
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in inherited}
    try:
        d = daemon(config, ready=False)  # started with those ignored
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    d.wait_ready()
    # Those four at least: the test's own process may have been started with more ignored
    # (a CI run in the background: SIGINT, SIGQUIT; under nohup: SIGHUP), which jobd resets too.
    said = re.search(r"signals ignored when jobd started: ([^;]*);", d.log())
    assert said and {s.name for s in inherited} <= set(said.group(1).split(", ")), d.log()
    for queue in ("here", "elsewhere"):
        r.xadd(f"jobd:{queue}", {"payload": "x"})
    for queue in ("here", "elsewhere"):
        wait_until(lambda q=queue: acked_all(r, f"jobd:{q}", 1), what=f"{queue} acked")
        masks = dict(
            line.split(":") for line in (tmp_path / f"sigs.{queue}").read_text().split("\n") if line
        )
        standard = (1 << 31) - 1  # signals 1..31; above are glibc's and real-time ones
        assert int(masks["SigIgn"], 16) & standard == 0, f"{queue}: {masks}"
        assert int(masks["SigBlk"], 16) == 0, f"{queue}: {masks}"


def test_job_id_defaults_to_stream_id_and_attempt_comes_from_the_entry(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", f'#!/bin/sh\necho "$JOBD_JOB_ID $JOBD_ATTEMPT" >> {tmp_path}/ids\n')
    daemon(write_config(queue_config("[./h.sh]")))
    plain = r.xadd("jobd:q", {"payload": "a"}).decode()
    r.xadd("jobd:q", {"payload": "b", "jobd_job_id": "orig-1", "jobd_attempt": "3"})
    r.xadd("jobd:q", {"payload": "c", "jobd_job_id": "orig-2", "jobd_attempt": "garbage"})
    wait_until(lambda: acked_all(r, "jobd:q", 3))
    assert (tmp_path / "ids").read_text().splitlines() == [f"{plain} 1", "orig-1 3", "orig-2 1"]


def test_output_is_logged_with_queue_and_job_id(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    script("h.sh", "#!/bin/sh\necho 'to stdout'\necho 'to stderr' >&2\nprintf 'no newline'\n")
    d = daemon(write_config(queue_config("[./h.sh]")))
    r.xadd("jobd:q", {"payload": "x", "job_id": "j-1"})
    wait_until(lambda: acked_all(r, "jobd:q", 1))
    d.wait_log("queue=q job=j-1 attempt=1 exit 0")
    log = d.log()
    assert "queue=q job=j-1 attempt=1 stdout: to stdout" in log
    assert "queue=q job=j-1 attempt=1 stderr: to stderr" in log
    assert "queue=q job=j-1 attempt=1 stdout: no newline" in log


def test_large_output_and_payload_never_block(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script(
        "h.py",
        f"""
        #!{sys.executable}
        import sys, hashlib
        data = sys.stdin.buffer.read()
        open("{tmp_path}/digest", "w").write(hashlib.sha256(data).hexdigest())
        sys.stdout.write("o" * 4_000_000)
        sys.stderr.write("e" * 4_000_000 + "TAIL")
        """,
    )
    script("ignore_stdin.sh", "#!/bin/sh\nexit 0\n")
    config = write_config(
        """
        redis: {url: '{redis}'}
        queues:
          big: {command: [./h.py]}
          deaf: {command: [./ignore_stdin.sh]}
        """
    )
    d = daemon(config)
    payload = os.urandom(3 * 1024 * 1024)
    r.xadd("jobd:big", {"payload": payload})
    r.xadd("jobd:deaf", {"payload": payload})
    wait_until(lambda: acked_all(r, "jobd:big", 1) and acked_all(r, "jobd:deaf", 1))
    import hashlib

    assert (tmp_path / "digest").read_text() == hashlib.sha256(payload).hexdigest()
    d.wait_log("more bytes not logged")
    assert len(d.log()) < 1_000_000, "handler output is truncated in the logs"
    assert "Traceback" not in d.log()


def test_nonzero_exit_is_never_acknowledged_silently(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    script("h.sh", "#!/bin/sh\necho failing >&2\ncase $(cat) in fail) exit 3;; esac\n")
    config = write_config(queue_config("[./h.sh]", retry="{max_attempts: 2, backoff: 100ms}"))
    d = daemon(config)
    r.xadd("jobd:q", {"payload": "fail", "job_id": "bad"})
    r.xadd("jobd:q", {"payload": "ok", "job_id": "good"})
    d.wait_log("queue=q job=good attempt=1 exit 0")
    d.wait_log("queue=q job=bad attempt=1 exit 3 after")
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 1, what="the dead letter after two attempts")
    [(_, record)] = r.xrange("{jobd:q}:dead")
    assert record[b"jobd_job_id"] == b"bad" and record[b"jobd_exit_code"] == b"3"
    assert record[b"jobd_attempts"] == b"2" and record[b"jobd_stderr"] == b"failing\n"
    wait_until(lambda: pending_count(r, "jobd:q") == 0)


def test_timeout_sends_sigterm_to_the_group_then_sigkill(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script(
        "stubborn.sh",
        f"""
        #!/bin/sh
        trap 'echo got TERM' TERM
        sleep 300 &
        echo $! > {tmp_path}/child.pid
        echo $$ > {tmp_path}/leader.pid
        while true; do sleep 0.05; done
        """,
    )
    config = queue_config(
        "[./stubborn.sh]", timeout="700ms", kill_grace="700ms", retry="{max_attempts: 1}"
    )
    d = daemon(write_config(config))
    r.xadd("jobd:q", {"payload": "x", "job_id": "slow"})
    stopped = r"queue=q job=slow attempt=1 timed out after ([0-9.]+)s; SIGTERM"  # how long it ran
    wait_until(lambda: re.search(stopped, d.log()), what="its timeout's SIGTERM")
    ran = re.search(stopped, d.log())
    assert ran and 0.7 <= float(ran.group(1)) < 1.4, "SIGTERM at its 700 ms timeout"
    d.wait_log("queue=q job=slow attempt=1 still running 0.7s after SIGTERM; SIGKILL")
    d.wait_log("queue=q job=slow attempt=1 timed out (signal SIGKILL)")
    for name in ("leader.pid", "child.pid"):
        pid = int((tmp_path / name).read_text())
        wait_until(lambda pid=pid: not psutil.pid_exists(pid), what=f"{name} to be gone")
    assert "got TERM" in d.log()
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 1, what="the timed-out job dead-lettered")
    assert r.xrange("{jobd:q}:dead")[0][1][b"jobd_error"] == b"timeout"


def test_concurrency_and_reading_no_more_than_free_slots(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    script(
        "h.sh",
        f"""
        #!/bin/sh
        touch {tmp_path}/started.$JOBD_MESSAGE_ID
        while [ ! -e {gate} ]; do sleep 0.02; done
        """,
    )
    d = daemon(write_config(queue_config("[./h.sh]", concurrency=3)))
    for i in range(10):
        r.xadd("jobd:q", {"payload": str(i)})

    def started() -> int:
        return len(list(tmp_path.glob("started.*")))

    wait_until(lambda: started() == 3, what="three handlers")
    group = group_info(r, "jobd:q")
    assert group["pending"] == 3, "the daemon holds no entry it cannot start"
    assert group["lag"] == 7
    assert started() == 3
    gate.touch()
    wait_until(lambda: acked_all(r, "jobd:q", 10))
    assert started() == 10
    assert d.proc.poll() is None


def test_graceful_stop_lets_running_handlers_finish(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    script(
        "h.sh",
        f"""
        #!/bin/sh
        trap '' TERM
        touch {tmp_path}/started
        while [ ! -e {gate} ]; do sleep 0.02; done
        touch {tmp_path}/finished
        """,
    )
    d = daemon(write_config(queue_config("[./h.sh]")))
    r.xadd("jobd:q", {"payload": "x"})
    wait_until(lambda: (tmp_path / "started").exists())
    d.signal(signal.SIGTERM)
    d.wait_log("SIGTERM: stopping; 1 handler(s) running")
    r.xadd("jobd:q", {"payload": "arrives during shutdown"})
    gate.touch()
    assert d.proc.wait(30) == 0
    assert (tmp_path / "finished").exists()
    assert len(list(tmp_path.glob("started*"))) == 1, "no new job started while stopping"
    for entry in r.xpending_range("jobd:q", "jobd", "-", "+", 10):
        # Read in the instant the stop began: handed back, so another consumer takes it now.
        assert entry["time_since_delivered"] > 10 * 365 * 86400 * 1000


def test_handlers_past_shutdown_grace_are_stopped_and_handed_back(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", f"#!/bin/sh\necho $$ > {tmp_path}/pid\nexec sleep 300\n")
    config = write_config(queue_config("[./h.sh]", kill_grace="5s") + "shutdown_grace: 300ms\n")
    d = daemon(config)
    mid = r.xadd("jobd:q", {"payload": "x"})
    wait_until(lambda: (tmp_path / "pid").exists())
    d.signal(signal.SIGTERM)
    assert d.proc.wait(30) == 0
    assert not psutil.pid_exists(int((tmp_path / "pid").read_text()))
    [entry] = r.xpending_range("jobd:q", "jobd", "-", "+", 10)
    assert entry["message_id"] == mid
    assert entry["time_since_delivered"] > 10 * 365 * 86400 * 1000, "handed back: idle at once"
    assert "still running at the end of shutdown_grace" in d.log()


def test_second_sigterm_stops_handlers_at_once(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", f"#!/bin/sh\ntouch {tmp_path}/started\nexec sleep 300\n")
    d = daemon(write_config(queue_config("[./h.sh]") + "shutdown_grace: 5m\n"))
    r.xadd("jobd:q", {"payload": "x"})
    wait_until(lambda: (tmp_path / "started").exists())
    d.signal(signal.SIGTERM)
    d.wait_log("SIGTERM: stopping")
    d.signal(signal.SIGINT)
    assert d.proc.wait(30) == 0
    assert "SIGINT again: stopping 1 running handler(s) now" in d.log()


def test_handler_that_cannot_start_is_retried_and_the_daemon_goes_on(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    handler = script("h.sh", f"#!/bin/sh\ntouch {tmp_path}/ran.$(cat)\n")
    config = queue_config(
        "[./h.sh]", retry="{max_attempts: 20, backoff: 100ms, max_backoff: 200ms}"
    )
    d = daemon(write_config(config))
    handler.chmod(0o644)  # a bad deploy after the daemon started
    r.xadd("jobd:q", {"payload": "1", "job_id": "first"})
    d.wait_log("queue=q job=first attempt=1 cannot start")
    d.wait_log("Permission denied: retry in")
    handler.chmod(0o755)  # the fix is deployed: the retry succeeds
    wait_until(lambda: (tmp_path / "ran.1").exists())
    r.xadd("jobd:q", {"payload": "2"})
    wait_until(lambda: (tmp_path / "ran.2").exists())
    wait_until(lambda: pending_count(r, "jobd:q") == 0)
    assert d.proc.poll() is None


def test_grandchildren_are_cleaned_up_with_the_group(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", f"#!/bin/sh\nsleep 300 &\necho $! > {tmp_path}/orphan.pid\nexit 0\n")
    daemon(write_config(queue_config("[./h.sh]")))
    r.xadd("jobd:q", {"payload": "x"})
    wait_until(lambda: acked_all(r, "jobd:q", 1))
    pid = int((tmp_path / "orphan.pid").read_text())
    wait_until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie")


def test_jobs_added_before_the_group_exists_are_run(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", f"#!/bin/sh\ncat >> {tmp_path}/seen\n")
    r.xadd("jobd:q", {"payload": "early\n"})
    daemon(write_config(queue_config("[./h.sh]")))
    r.xadd("jobd:q", {"payload": "late\n"})
    wait_until(lambda: acked_all(r, "jobd:q", 2))
    assert (tmp_path / "seen").read_text() == "early\nlate\n"


def test_each_daemon_process_has_its_own_consumer(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    script("h.sh", "#!/bin/sh\nexit 0\n")
    config = write_config(queue_config("[./h.sh]"))
    first, second = daemon(config), daemon(config)
    wait_group(r, "jobd:q")

    def consumers() -> list[bytes]:
        return [c["name"] for c in r.xinfo_consumers("jobd:q", "jobd")]

    for _ in range(20):
        r.xadd("jobd:q", {"payload": "x"})
    wait_until(lambda: acked_all(r, "jobd:q", 20))
    wait_until(lambda: len(consumers()) == 2, what="two consumers")
    names = {n.decode() for n in consumers()}
    assert all(str(p) in " ".join(names) for p in (first.proc.pid, second.proc.pid))


def test_group_recreated_when_deleted_under_the_daemon(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", f"#!/bin/sh\ncat >> {tmp_path}/seen\n")
    d = daemon(write_config(queue_config("[./h.sh]")))
    wait_group(r, "jobd:q")
    r.delete("jobd:q")
    d.wait_log("group or stream vanished")
    wait_group(r, "jobd:q")
    r.xadd("jobd:q", {"payload": "after\n"})
    wait_until(
        lambda: (tmp_path / "seen").exists() and (tmp_path / "seen").read_text() == "after\n"
    )


def test_the_example_config_runs_its_handlers(daemon: Daemon, tmp_path: Path) -> None:
    """The quick start's config, as shipped: an embedded Redis, handlers in sh, Python, Perl."""
    example = Path(__file__).resolve().parent.parent / "config" / "example.yaml"
    state, redis_state = tmp_path / "state", tmp_path / "redis-state"
    env = {"EXAMPLE_STATE": str(state), "STATE_DIRECTORY": str(redis_state)}
    d = daemon(example, env=env)
    r = redis.Redis(unix_socket_path=str(redis_state / "redis.sock"))
    r.xadd("jobd:greetings", {"payload": "world", "job_id": "g1"})
    r.xadd("jobd:greetings", {"payload": "", "job_id": "g-empty"})
    r.xadd(
        "example:reports", {"payload": '{"title": "sales", "numbers": [3, 4.5]}', "job_id": "r1"}
    )
    r.xadd("example:reports", {"payload": "not json", "job_id": "r-bad"})
    r.xadd("jobd:words", {"payload": "the quick brown fox", "job_id": "w1"})
    r.xadd("jobd:words", {"payload": "   ", "job_id": "w-empty"})
    r.xadd("jobd:words", {"payload": "the quick brown fox", "job_id": "w1"})  # sent twice
    wait_until(lambda: (state / "reports" / "r1.txt").exists())
    d.wait_log("queue=greetings job=g1 attempt=1 stdout: Hello, world! (attempt 1)")
    d.wait_log("queue=greetings job=g-empty attempt=1 exit 65")
    d.wait_log("queue=reports job=r-bad attempt=1 exit 65")
    d.wait_log("queue=words job=w-empty attempt=1 exit 65")
    d.wait_log("queue=words job=w1 attempt=1 stdout: job w1 already counted")
    assert (state / "reports" / "r1.txt").read_text() == "sales\ncount=2 sum=7.5\n"
    assert (state / "greetings" / "g1").read_text() == "world\n"
    assert (state / "words" / "w1").read_text() == "4\n"
    wait_until(lambda: r.xlen("{jobd:words}:dead") == 1 and r.xlen("{jobd:greetings}:dead") == 1)
    r.close()


def imported(log: str) -> set[str]:
    """The modules a process imported, from its PYTHONPROFILEIMPORTTIME lines."""
    return {line.rsplit("|", 1)[1].strip() for line in log.splitlines()
            if line.startswith("import time:")}  # fmt: skip


def test_a_daemon_loads_only_what_its_config_uses(
    r: redis.Redis, write_config, daemon: Daemon
) -> None:
    """No endpoint, no schedule, a valid file: the daemon loads neither the dashboard and its
    HTTP server nor croniter (whose import runs `file`) nor jsonschema: a quicker start. With a
    schedule and an endpoint it loads them and runs them."""
    plain = daemon(write_config(queue_config("[/bin/true]")), {"PYTHONPROFILEIMPORTTIME": "1"})
    modules = imported(plain.log())
    assert "jobd.daemon.loop" in modules, "the import lines are read"
    assert not modules & {"jobd.web.dashboard", "waitress", "croniter", "jsonschema"}
    plain.stop()
    config = write_config(
        """
        redis: {url: '{redis}'}
        metrics: {listen: '127.0.0.1:PORT'}
        queues:
          q:
            command: [/bin/true]
            schedule: [{cron: '* * * * * *', name: every-second}]
        """.replace("PORT", str(free_port())),
        "served.yaml",
    )
    served = daemon(config, {"PYTHONPROFILEIMPORTTIME": "1"})
    wait_until(lambda: r.xlen("jobd:q") > 0, what="a tick of the schedule enqueued")
    assert {"jobd.web.dashboard", "waitress", "croniter"} <= imported(served.log())
