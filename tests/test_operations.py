"""Operating jobd: systemd units and notify, reload on SIGHUP, status, metrics, logs."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
import redis
from support import (
    DaemonProcess,
    acked_all,
    free_port,
    jobd_cli,
    pending_count,
    wait_group,
    wait_until,
)

ROOT = Path(__file__).resolve().parent.parent
Daemon = Callable[..., DaemonProcess]


# -- systemd -------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason=".ci/run installs systemd")
@pytest.mark.parametrize(
    ("unit", "as_name"), [("jobd.service", "jobd.service"), ("jobd@.service", "jobd@media.service")]
)
def test_units_pass_systemd_analyze_verify(tmp_path: Path, unit: str, as_name: str) -> None:
    script = shutil.which("jobd", path=str(Path(sys.executable).parent))
    assert script
    text = (ROOT / "systemd" / unit).read_text()
    (tmp_path / as_name).write_text(text.replace("/usr/local/bin/jobd", script))
    result = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / as_name)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "jobd" not in result.stderr, result.stderr
    for line in ("Type=notify", "KillMode=mixed", "RestartPreventExitStatus=78", "WatchdogSec=",
                 "ExecReload=/bin/kill -HUP $MAINPID", "NoNewPrivileges=yes", "ProtectSystem=strict",
                 "PrivateTmp=yes", "StateDirectory=", "ExecStartPre="):  # fmt: skip
        assert line in text


class NotifySocket:
    """A real AF_UNIX datagram socket, as systemd listens on, collecting what jobd sends."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, dict[str, str]]] = []
        self.closed = False
        threading.Thread(target=self._collect, daemon=True).start()

    def _collect(self) -> None:
        while not self.closed:
            try:
                data = self.sock.recv(4096)
            except (TimeoutError, OSError):
                continue
            fields = dict(line.split("=", 1) for line in data.decode().splitlines())
            self.messages.append((time.monotonic(), fields))

    def having(self, key: str) -> list[dict[str, str]]:
        return [m for _, m in self.messages if key in m]

    def close(self) -> None:
        self.closed = True
        self.sock.close()


@pytest.fixture(params=["path", "abstract"])
def notify_socket(request, tmp_path: Path) -> Iterator[NotifySocket]:
    address = (
        str(tmp_path / "notify.sock")
        if request.param == "path"
        else f"@jobd-test-{os.getpid()}-{time.monotonic_ns()}"
    )
    sock = NotifySocket(address)
    yield sock
    sock.close()


def test_sd_notify_ready_status_watchdog_reload_stopping(
    r: redis.Redis,
    write_config,
    script,
    daemon: Daemon,
    tmp_path: Path,
    notify_socket: NotifySocket,
) -> None:
    script("env.sh", f"#!/bin/sh\nenv > {tmp_path}/env\n")
    config = write_config("redis: {url: '{redis}'}\nqueues:\n  q: {command: [./env.sh]}\n")
    env = {
        "NOTIFY_SOCKET": notify_socket.address, "WATCHDOG_USEC": "400000",
        "CREDENTIALS_DIRECTORY": str(tmp_path), "JOURNAL_STREAM": "8:12345",
    }  # fmt: skip
    d = daemon(config, env=env)
    wait_until(lambda: notify_socket.having("READY"), what="READY=1")
    [ready] = notify_socket.having("READY")
    assert ready["READY"] == "1" and "handlers running" in ready["STATUS"]
    wait_group(r, "jobd:q")
    wait_until(lambda: len(notify_socket.having("WATCHDOG")) >= 5, what="watchdog pings")
    times = [t for t, m in notify_socket.messages if "WATCHDOG" in m]
    assert all(0.1 < b - a < 0.35 for a, b in zip(times[-4:], times[-3:], strict=False)), times

    r.xadd("jobd:q", {"payload": "x"})
    wait_until(lambda: acked_all(r, "jobd:q", 1))
    handler_env = (tmp_path / "env").read_text()
    for name in (
        "NOTIFY_SOCKET",
        "WATCHDOG_USEC",
        "WATCHDOG_PID",
        "CREDENTIALS_DIRECTORY",
        "JOURNAL_STREAM",
    ):
        assert f"{name}=" not in handler_env

    d.signal(signal.SIGHUP)
    wait_until(lambda: len(notify_socket.having("READY")) == 2, what="READY=1 after the reload")
    reloading = notify_socket.having("RELOADING")
    assert (
        len(reloading) == 1
        and abs(int(reloading[0]["MONOTONIC_USEC"]) - time.monotonic_ns() // 1000) < 10_000_000
    )
    order = [k for _, m in notify_socket.messages for k in m if k in ("RELOADING", "READY")]
    assert order == ["READY", "RELOADING", "READY"]
    d.signal(signal.SIGTERM)
    assert d.proc.wait(30) == 0
    assert notify_socket.having("STOPPING")


def test_watchdog_stops_while_the_main_loop_is_wedged(
    r: redis.Redis, write_config, script, tmp_path: Path, notify_socket: NotifySocket
) -> None:
    """The loop logs synchronously; with its stderr pipe full it blocks, like a stalled journal."""
    script(
        "chatty.sh",
        '#!/bin/sh\ni=0\nwhile [ $i -lt 20000 ]; do echo "line $i of chatter"; i=$((i+1)); done\n',
    )
    config = write_config("redis: {url: '{redis}'}\nqueues:\n  q: {command: [./chatty.sh]}\n")
    env = {**os.environ, "NOTIFY_SOCKET": notify_socket.address, "WATCHDOG_USEC": "400000"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobd", "run", str(config)], stderr=subprocess.PIPE, env=env
    )
    try:
        wait_until(lambda: notify_socket.having("READY"), what="READY=1")
        r.xadd("jobd:q", {"payload": "x"})

        # Nobody reads the daemon's stderr: the pipe fills and the loop blocks in a log write.
        def last_ping() -> float:
            return max((t for t, m in notify_socket.messages if "WATCHDOG" in m), default=0.0)

        wait_until(lambda: time.monotonic() - last_ping() > 1.5, what="the watchdog pings to stop")
        drained = threading.Thread(target=proc.stderr.read, daemon=True)  # type: ignore[union-attr]
        drained.start()
        resumed_after = time.monotonic()
        wait_until(lambda: last_ping() > resumed_after, what="the pings to resume")
        wait_until(lambda: acked_all(r, "jobd:q", 1))
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()  # type: ignore[union-attr]


# -- reload --------------------------------------------------------------------------------------

RELOAD_BEFORE = """
redis: {{url: '{redis}'}}
queues:
  a: {{command: [./work.sh], env: {{VERSION: one}}}}
  c: {{command: [./work.sh], env: {{VERSION: one}}}}
"""
RELOAD_AFTER = """
redis: {{url: '{redis}'}}
queues:
  a: {{command: [./work.sh], concurrency: 2, env: {{VERSION: two}}}}
  b: {{command: [./work.sh], env: {{VERSION: two}}}}
"""


def test_reload_applies_added_removed_and_changed_queues(
    r: redis.Redis, redis_server, script, daemon: Daemon, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    script(
        "work.sh",
        f'#!/bin/sh\np=$(cat)\necho "$JOBD_QUEUE $p $VERSION start" >> {tmp_path}/runs\n'
        f'[ "$p" = slow ] && while [ ! -e {gate} ]; do sleep 0.05; done\n'
        f'echo "$JOBD_QUEUE $p $VERSION end" >> {tmp_path}/runs\n',
    )
    config = tmp_path / "jobd.yaml"
    config.write_text(RELOAD_BEFORE.format(redis=redis_server.url))
    d = daemon(config)
    r.xadd("jobd:a", {"payload": "slow"})
    r.xadd("jobd:c", {"payload": "slow"})

    def runs() -> list[str]:
        return (tmp_path / "runs").read_text().splitlines() if (tmp_path / "runs").exists() else []

    wait_until(lambda: len(runs()) == 2, what="both slow jobs running")
    config.write_text("queues: {a: {command: [./work.sh], concurrency: 0}}\n")
    d.signal(signal.SIGHUP)
    d.wait_log("reload refused: 1 problem(s); the running config stays")
    assert "jobd.yaml:1:" in d.log(), "every error is logged with its position"

    config.write_text(RELOAD_AFTER.format(redis=redis_server.url))
    d.signal(signal.SIGHUP)
    d.wait_log("reload done: a, b")
    for i in range(2):
        r.xadd("jobd:a", {"payload": f"new-{i}"})
    r.xadd("jobd:b", {"payload": "new"})
    r.xadd("jobd:c", {"payload": "never"})
    wait_until(lambda: {"a new-0 two end", "a new-1 two end", "b new two end"} <= set(runs()))
    gate.touch()
    wait_until(
        lambda: {"a slow one end", "c slow one end"} <= set(runs()),
        what="running jobs finish as they started",
    )
    wait_until(lambda: acked_all(r, "jobd:a", 3) and acked_all(r, "jobd:b", 1))
    wait_until(lambda: pending_count(r, "jobd:c") == 0, what="the removed queue drained")
    assert sorted(runs()) == sorted([
        "a slow one start", "c slow one start", "a new-0 two start", "a new-0 two end",
        "a new-1 two start", "a new-1 two end", "b new two start", "b new two end",
        "a slow one end", "c slow one end",
    ]), "nothing dropped, duplicated or restarted"  # fmt: skip
    assert r.xinfo_groups("jobd:c")[0]["lag"] == 1, "the removed queue takes no new job"
    assert d.proc.poll() is None


# -- status --------------------------------------------------------------------------------------


def test_status_reports_every_queue(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    script(
        "h.sh",
        f"#!/bin/sh\ncase $(cat) in fail) exit 65;; hold) while [ ! -e {gate} ]; do sleep 0.05; done;; esac\n",
    )
    # No reading ahead: "waiting" stays unread behind "hold" (lag 1), not read, then handed
    # back and pending with it until a slot frees (the figures below are those of the stream).
    config = write_config(
        "redis: {url: '{redis}'}\nqueues:\n  q: {command: [./h.sh], concurrency: 1, prefetch: 0}\n"
    )
    d = daemon(config)
    for payload in ("ok", "ok", "fail"):
        r.xadd("jobd:q", {"payload": payload})
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 1 and acked_all(r, "jobd:q", 3))
    r.xadd("jobd:q", {"payload": "hold"})
    r.xadd("jobd:q", {"payload": "waiting"})
    assert jobd_cli("enqueue", "-c", str(config), "q", "later", "--delay", "1h").returncode == 0
    wait_until(lambda: pending_count(r, "jobd:q") == 1)
    result = jobd_cli("status", "-c", str(config), "--json")
    assert result.returncode == 0, result.stderr
    q = orjson.loads(result.stdout)["queues"]["q"]
    assert (q["length"], q["lag"], q["pending"], q["delayed"], q["dead_lettered"]) == (
        5,
        1,
        1,
        1,
        1,
    )
    assert 0 <= q["oldest_pending_age"] < 30
    done = q["this_minute"]["done"] + q["last_minute"]["done"]
    failed = q["this_minute"]["failed"] + q["last_minute"]["failed"]
    assert (done, failed) == (2, 1)
    [consumer] = q["consumers"]
    assert (
        str(d.proc.pid) in consumer["name"] and consumer["holding"] == 1 and consumer["idle"] < 30
    )
    text = jobd_cli("status", "-c", str(config)).stdout.decode()
    assert "queue q" in text and "lag 1" in text and "pending 1" in text and "holding 1" in text
    # Redis reports lag as null after an arbitrary SETID: jobd counts instead.
    first = r.xrange("jobd:q", count=1)[0][0]
    r.xgroup_setid("jobd:q", "jobd", first)
    q = orjson.loads(jobd_cli("status", "-c", str(config), "--json").stdout)["queues"]["q"]
    assert q["lag"] == 4
    gate.touch()


def test_status_exits_non_zero_when_redis_is_unreachable(write_config) -> None:
    config = write_config(
        "redis: {url: 'redis://127.0.0.1:1/0'}\nqueues:\n  q: {command: [/bin/true]}\n"
    )
    result = jobd_cli("status", "-c", str(config))
    assert result.returncode == 69 and b"cannot reach Redis" in result.stderr


# -- metrics and logs ----------------------------------------------------------------------------


def test_metrics_and_healthz(r: redis.Redis, write_config, script, daemon: Daemon) -> None:
    script("h.sh", '#!/bin/sh\n[ "$(cat)" = ok ]\n')
    port = free_port()
    config = write_config(
        "redis: {url: '{redis}'}\n"
        f"metrics: {{listen: '127.0.0.1:{port}'}}\n"
        "queues:\n  q: {command: [./h.sh], concurrency: 3, retry: {max_attempts: 2, backoff: 50ms}}\n"
    )
    daemon(config)
    r.xadd("jobd:q", {"payload": "ok"})
    r.xadd("jobd:q", {"payload": "bad"})
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 1 and pending_count(r, "jobd:q") == 0)

    def get(path: str) -> tuple[int, str]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()

    def sample(text: str, name: str) -> float:
        """The series' value; NaN while it does not exist yet."""
        found = [line.split()[-1] for line in text.splitlines() if line.startswith(name)]
        return float(found[0]) if found else float("nan")

    _, text = get("/metrics")
    assert sample(text, 'jobd_jobs_started_total{queue="q"}') == 3
    assert sample(text, 'jobd_jobs_succeeded_total{queue="q"}') == 1
    assert sample(text, 'jobd_jobs_retried_total{queue="q"}') == 1
    assert sample(text, 'jobd_jobs_dead_lettered_total{error="exit",queue="q"}') == 1
    assert sample(text, 'jobd_jobs_reclaimed_total{queue="q"}') == 0
    assert sample(text, 'jobd_leases_lost_total{queue="q"}') == 0
    assert sample(text, 'jobd_handler_duration_seconds_count{queue="q"}') == 3
    assert sample(text, 'jobd_enqueue_to_start_seconds_count{queue="q"}') == 3
    assert sample(text, 'jobd_handlers_running{queue="q"}') == 0
    assert sample(text, 'jobd_slots_free{queue="q"}') == 3
    assert get("/healthz") == (200, "ok\n")
    r.xadd("jobd:q", {"payload": "ok"})  # queue gauges come from the status duty, every 5 s
    wait_until(lambda: sample(get("/metrics")[1], 'jobd_queue_dead_lettered{queue="q"}') == 1, 15)
    _, text = get("/metrics")
    for gauge in ("jobd_queue_lag", "jobd_queue_pending", "jobd_queue_oldest_pending_age_seconds",
                  "jobd_queue_delayed"):  # fmt: skip
        assert sample(text, f'{gauge}{{queue="q"}}') >= 0


def test_json_logs_and_rate_limited_output(
    r: redis.Redis, write_config, script, tmp_path: Path
) -> None:
    script(
        "flood.sh", '#!/bin/sh\ni=0\nwhile [ $i -lt 8000 ]; do echo "line $i"; i=$((i+1)); done\n'
    )
    config = write_config("redis: {url: '{redis}'}\nqueues:\n  q: {command: [./flood.sh]}\n")
    log_path = tmp_path / "jobd.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobd", "run", str(config), "--log-format", "json"],
            stderr=log_file,
        )
        try:
            wait_until(lambda: b"jobd running" in log_path.read_bytes())
            r.xadd("jobd:q", {"payload": "x", "job_id": "flood-1"})
            wait_until(lambda: acked_all(r, "jobd:q", 1))
            wait_until(lambda: b"exit 0 after" in log_path.read_bytes())
        finally:
            proc.terminate()
            proc.wait(30)
    records = [orjson.loads(line) for line in log_path.read_bytes().splitlines()]
    job_lines = [x for x in records if x.get("job") == "flood-1"]
    assert job_lines and all(x["queue"] == "q" and x["attempt"] == 1 for x in job_lines)
    assert {"ts", "level", "logger", "message"} <= set(records[0])
    output = [x for x in job_lines if "stdout: line" in x["message"]]
    assert 1000 <= len(output) < 8000, "handler output is rate-limited"
    assert any("not logged" in x["message"] for x in records)


def test_status_watch_refreshes_until_interrupted(r: redis.Redis, write_config) -> None:
    config = write_config("redis: {url: '{redis}'}\nqueues:\n  q: {command: [/bin/true]}\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobd", "status", "-c", str(config), "--watch", "0.1"],
        stdout=subprocess.PIPE,
    )
    try:
        seen = b""
        while seen.count(b"jobd status on") < 3:
            seen += proc.stdout.read1(65536)  # type: ignore[union-attr]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        assert seen.count(b"\x1b[2J") >= 3, "the screen is cleared before each refresh"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
