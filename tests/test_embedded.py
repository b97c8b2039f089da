"""The embedded Redis: a config with no redis.url works on a machine with nothing else."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import psutil
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
    except redis.ConnectionError:
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
