"""The embedded Redis: a config with no redis.url works on a machine with nothing else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import redis
from support import DaemonProcess, find_redis_server, jobd_cli, wait_until

Daemon = Callable[..., DaemonProcess]


def servers_on(socket_path: Path) -> list[psutil.Process]:
    """The live server of a state directory (its pid file sits beside the socket)."""
    pidfile = socket_path.parent / "redis.pid"
    try:
        process = psutil.Process(int(pidfile.read_text()))
    except (FileNotFoundError, ValueError, psutil.NoSuchProcess):
        return []
    return [] if process.status() == psutil.STATUS_ZOMBIE else [process]


def embedded_config(tmp_path: Path, extra: str = "") -> Path:
    handler = tmp_path / "h.sh"
    handler.write_text(
        f'#!/bin/sh\necho "$(cat)" >> {tmp_path}/ran\n[ "$(tail -n1 {tmp_path}/ran)" != fail ]\n'
    )
    handler.chmod(0o755)
    config = tmp_path / "jobd.yaml"
    config.write_text(f"{extra}queues:\n  q: {{command: [./h.sh], retry: {{max_attempts: 1}}}}\n")
    return config


def ran(tmp_path: Path) -> list[str]:
    path = tmp_path / "ran"
    return path.read_text().split() if path.exists() else []


def test_commands_and_daemon_share_one_embedded_server(tmp_path: Path, daemon: Daemon) -> None:
    config = embedded_config(tmp_path)
    state = tmp_path / ".jobd"
    validate = jobd_cli("validate", str(config)).stdout.decode()
    assert f"on an embedded Redis ({find_redis_server()})" in validate
    assert f"state in {state}" in validate

    # No daemon yet: the command starts the server for its own length, and it keeps the job.
    assert jobd_cli("enqueue", "-c", str(config), "q", "early").returncode == 0
    assert (state / "appendonlydir").is_dir()
    assert servers_on(state / "redis.sock") == [], "stopped after the command"

    d = daemon(config)
    wait_until(lambda: ran(tmp_path) == ["early"], what="the job enqueued before the daemon")
    [server] = servers_on(state / "redis.sock")
    assert server.ppid() == d.proc.pid, "the daemon supervises its server"
    assert jobd_cli("enqueue", "-c", str(config), "q", "fail").returncode == 0
    wait_until(lambda: "fail" in ran(tmp_path))
    status = jobd_cli("status", "-c", str(config), "--json")
    assert status.returncode == 0 and b'"dead_lettered": 1' in status.stdout
    assert b"job=" in jobd_cli("dlq", "-c", str(config), "q", "list").stdout

    d.signal(signal.SIGTERM)
    assert d.proc.wait(30) == 0
    wait_until(lambda: servers_on(state / "redis.sock") == [], what="the server stopped after jobd")
    # Still there with no daemon: the dead letter survived the stop (AOF).
    assert b"job=" in jobd_cli("dlq", "-c", str(config), "q", "list").stdout


def test_a_killed_embedded_server_is_restarted_and_nothing_is_lost(
    tmp_path: Path, daemon: Daemon
) -> None:
    config = embedded_config(tmp_path, "redis: {embedded: {dir: state, appendfsync: always}}\n")
    state = tmp_path / "state"
    d = daemon(config)
    client = redis.Redis(unix_socket_path=str(state / "redis.sock"))
    client.xadd("jobd:q", {"payload": "one"})
    wait_until(lambda: ran(tmp_path) == ["one"])
    [server] = servers_on(state / "redis.sock")
    server.kill()
    d.wait_log("embedded Redis exited")
    wait_until(lambda: len(servers_on(state / "redis.sock")) == 1, what="a new server")
    wait_until(lambda: _answers(client), what="the new server to answer")
    client.xadd("jobd:q", {"payload": "two"})
    wait_until(lambda: ran(tmp_path) == ["one", "two"], what="jobs flowing again")
    assert client.xlen("jobd:q") == 2, "the first entry survived the kill (appendfsync always)"
    client.close()


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except (redis.ConnectionError, redis.BusyLoadingError):
        return False


def test_state_directory_from_systemd(tmp_path: Path) -> None:
    config = embedded_config(tmp_path)
    state = tmp_path / "var-lib-jobd"
    out = jobd_cli(
        "validate", str(config), env={"STATE_DIRECTORY": f"{state}:/other"}
    ).stdout.decode()
    assert f"state in {state}" in out


def test_no_server_binary_is_a_clear_error(tmp_path: Path) -> None:
    config = embedded_config(tmp_path)
    env = {"JOBD_REDIS_SERVER": "no-such-redis-server-binary"}
    for args in (("run", str(config)), ("enqueue", "-c", str(config), "q", "x")):
        result = jobd_cli(*args, env=env)
        assert result.returncode == 69, result.stderr
        assert b"no redis-server or valkey-server" in result.stderr
        assert b"Traceback" not in result.stderr


def test_a_server_orphaned_by_a_killed_daemon_is_replaced(tmp_path: Path, daemon: Daemon) -> None:
    config = embedded_config(tmp_path, "redis: {embedded: {dir: state, appendfsync: always}}\n")
    state = tmp_path / "state"
    first = daemon(config)
    [orphan] = servers_on(state / "redis.sock")
    first.proc.kill()  # the daemon alone: its server, in its own process group, lives on
    first.proc.wait()
    client = redis.Redis(unix_socket_path=str(state / "redis.sock"))
    client.xadd("jobd:q", {"payload": "kept"})
    second = daemon(config)
    second.wait_log("an embedded Redis from an earlier run still answers")
    wait_until(lambda: not orphan.is_running() or orphan.status() == psutil.STATUS_ZOMBIE)
    [server] = servers_on(state / "redis.sock")
    assert server.pid != orphan.pid and server.ppid() == second.proc.pid
    wait_until(lambda: ran(tmp_path) == ["kept"], what="the job written to the orphan, run")
    client.close()


def _state_with_keys(state: Path, keys: int) -> None:
    """An embedded state directory whose AOF holds ``keys`` keys (a server loads it for about
    0.7 s a million keys): made by a server of the test's own, then shut down."""
    state.mkdir(mode=0o700)
    sock = state / "fill.sock"
    server = subprocess.Popen(
        [find_redis_server(), "--port", "0", "--unixsocket", str(sock), "--dir", str(state),
         "--appendonly", "yes", "--save", "", "--enable-debug-command", "yes"],
        stdout=subprocess.DEVNULL, umask=0o077,
    )  # fmt: skip
    # DEBUG POPULATE of millions of keys takes seconds, more on a loaded machine: no timeout
    client = redis.Redis(unix_socket_path=str(sock), socket_timeout=None)
    try:
        wait_until(lambda: sock.exists(), what="the filling server")
        wait_until(lambda: _answers(client), what="the filling server to answer")
        client.execute_command("DEBUG", "POPULATE", keys)
        client.bgrewriteaof()
        wait_until(
            lambda: (
                not client.info("persistence")["aof_rewrite_in_progress"]
                and not client.info("persistence")["aof_rewrite_scheduled"]
            ),
            timeout=60,
            what="the AOF rewritten",
        )
        client.shutdown(nosave=True)
    except redis.ConnectionError:
        pass
    finally:
        client.close()
        try:
            server.wait(30)
        finally:  # never left running for a later test to trip on (ResourceWarning)
            if server.poll() is None:
                server.kill()
                server.wait()
    sock.unlink(missing_ok=True)


def test_an_embedded_redis_that_loads_for_a_while_is_not_killed_by_the_daemons_sweep(
    tmp_path: Path, daemon: Daemon
) -> None:
    """The embedded Redis is restarted after it died (here SIGKILLed) and loads its AOF (3M
    keys, about 2 s) while the daemon is idle: the sweep of adopted processes, which ends any
    child it cannot attribute when no job runs, must know it for the daemon's own from its
    start (``reaper.protect`` under ``spawn.LOCK``), not once it answers: else it SIGKILLs
    every new server while it loads, and Redis never comes back."""
    state = tmp_path / "state"
    _state_with_keys(state, 3_000_000)
    (tmp_path / "h.sh").write_text("#!/bin/sh\ncat >/dev/null\n")
    (tmp_path / "h.sh").chmod(0o755)
    config = tmp_path / "jobd.yaml"
    config.write_text("redis: {embedded: {dir: state}}\nqueues:\n  q: {command: [./h.sh]}\n")
    d = daemon(config)
    [first] = servers_on(state / "redis.sock")
    first.kill()
    d.wait_log("embedded Redis exited")
    client = redis.Redis(unix_socket_path=str(state / "redis.sock"))
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and not _answers(client):
            assert "outlived it; killed (not attributed" not in d.log(), (
                "the daemon's sweep SIGKILLed its own restarting embedded Redis:\n" + d.log()
            )
            time.sleep(0.1)
        assert _answers(client), "the embedded Redis answers again"
    finally:
        client.close()
    assert "outlived it; killed (not attributed" not in d.log()


def _ended(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# Takes the pid given on stdin for its next child (ns_last_pid: root), which leaves the session
# (setsid) and sleeps; says the child's pid, and exits: the child is adopted by the daemon. A
# fork that got another pid (another process of the machine took it first) is tried again.
TAKES_A_PID = """
import os, sys, time
wanted = int(sys.stdin.read())
end = time.monotonic() + 20  # other tests fork too: ns_last_pid is a race, tried until won
while time.monotonic() < end:
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(wanted - 1))
    pid = os.fork()
    if pid == 0:
        if os.getpid() != wanted:
            os._exit(0)
        os.setsid()
        os.execv("/bin/sleep", ["/bin/sleep", "600.%d" % wanted])
    if pid == wanted:
        break
    os.waitpid(pid, 0)
print(pid, flush=True)
"""


def test_a_stray_on_a_restarted_embedded_servers_old_pid_is_still_killed(
    tmp_path: Path, daemon: Daemon
) -> None:
    """The embedded Redis is restarted (SIGKILLed) while a job runs; its old pid, reaped, is
    no longer protected from the sweep (``reaper.unprotect``): a handler's escaped process that
    gets that pid (forced here with ns_last_pid) is killed at its job's end like any other."""
    if os.geteuid() != 0:
        pytest.skip("ns_last_pid needs root")
    state = tmp_path / "state"
    handler = tmp_path / "h.py"
    handler.write_text(f"#!{sys.executable}\n" + TAKES_A_PID)
    handler.chmod(0o755)
    (tmp_path / "slow.sh").write_text("#!/bin/sh\ncat >/dev/null\nsleep 3\n")
    (tmp_path / "slow.sh").chmod(0o755)
    config = tmp_path / "jobd.yaml"
    config.write_text(
        "redis: {embedded: {dir: state}}\nqueues:\n  q: {command: [./h.py]}\n"
        "  slow: {command: [./slow.sh]}\n"
    )
    d = daemon(config)
    client = redis.Redis(unix_socket_path=str(state / "redis.sock"))
    [first] = servers_on(state / "redis.sock")
    old = first.pid
    client.xadd("jobd:slow", {"payload": "x"})
    wait_until(lambda: "queue=slow" in d.log(), what="the slow job running")
    first.kill()
    d.wait_log("embedded Redis exited")
    wait_until(lambda: _answers(client), what="the new server to answer")
    client.xadd("jobd:q", {"payload": str(old)})
    found: list[psutil.Process] = []

    def stray() -> bool:
        found[:] = [p for p in psutil.process_iter(["cmdline"])
                    if p.info["cmdline"] == ["/bin/sleep", f"600.{old}"]]  # fmt: skip
        return bool(found)

    wait_until(stray, what="the escaped process")
    try:
        assert found[0].pid == old, "the escaped process took the old server's pid"
        wait_until(lambda: "exit 0" in d.log() and "queue=q" in d.log(), what="its job's end")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not _ended(found[0]):
            time.sleep(0.1)
        assert _ended(found[0]), (
            "an escaped process on the old embedded Redis's pid outlived its job by 5 s"
        )
    finally:
        client.close()
        if found and found[0].is_running():
            found[0].send_signal(signal.SIGKILL)
