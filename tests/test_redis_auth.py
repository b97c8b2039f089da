"""Redis credentials and transport: passwords from files and credentials, ACL users, TLS."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from support import (
    DaemonProcess,
    RedisServer,
    acked_all,
    find_redis_server,
    free_port,
    jobd_cli,
    pending_count,
    wait_until,
)

from jobd.store import connection as redisconn

Daemon = Callable[..., DaemonProcess]
PASSWORD = "s3cret-Pa55word"


@pytest.fixture
def acl_user(r: redis.Redis) -> Iterator[str]:
    """An ACL user that may run exactly the commands jobd needs, on jobd's keys only."""
    rules = ["on", f">{PASSWORD}", "~jobd:*", "~{jobd:*", "resetchannels", "-@all"]
    rules += [f"+{command}" for command in redisconn.ACL_COMMANDS]
    r.acl_setuser("jobd-worker", reset=True)
    r.execute_command("ACL", "SETUSER", "jobd-worker", *rules)
    yield "jobd-worker"
    r.acl_deluser("jobd-worker")


def test_acl_user_with_the_documented_commands_runs_everything(
    r: redis.Redis, acl_user: str, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    (tmp_path / "redis.password").write_text(PASSWORD + "\n")
    script(
        "h.sh", f"#!/bin/sh\ncase $(cat) in ok) exit 0;; esac\n[ -e {tmp_path}/fixed ] || exit 1\n"
    )
    config = write_config(
        f"""
        redis: {{url: '{{redis}}', username: {acl_user}, password_file: redis.password}}
        queues:
          q:
            command: [./h.sh]
            lease: {{renew_every: 100ms, reclaim_after: 300ms}}
            retry: {{max_attempts: 2, backoff: 50ms}}
            retention: {{maxlen: 1}}
            dedupe: {{window: 1h}}
            limits: {{concurrency: 2, rate: 1000/1s}}
            schedule: [{{cron: '* * * * * *', payload: ok}}]
        """
    )
    d = daemon(config)
    c = str(config)
    assert jobd_cli("enqueue", "-c", c, "q", "ok").returncode == 0
    assert jobd_cli("enqueue", "-c", c, "q", "fails", "--job-id", "f-1").returncode == 0
    assert jobd_cli("enqueue", "-c", c, "q", "ok", "--delay", "100ms").returncode == 0
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 1, what="a retried job dead-lettered")
    assert "job=f-1" in jobd_cli("dlq", "-c", c, "q", "list").stdout.decode()
    (tmp_path / "fixed").touch()
    assert jobd_cli("dlq", "-c", c, "q", "requeue", "f-1").returncode == 0
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 0 and pending_count(r, "jobd:q") == 0)
    wait_until(lambda: r.xlen("jobd:q") <= 2, what="retention trimming")
    # An entry orphaned by a dead consumer is reclaimed (XAUTOCLAIM) under the same ACL.
    r.xadd("jobd:q", {"payload": "ok"})
    r.xreadgroup("jobd", "dead-daemon", {"jobd:q": ">"})
    wait_until(lambda: pending_count(r, "jobd:q") == 0, what="the orphan reclaimed")
    status = jobd_cli("status", "-c", c, "--json")
    assert status.returncode == 0 and not status.stderr, status
    minutes = json.loads(status.stdout)["queues"]["q"]  # the test may cross a minute's end
    assert minutes["this_minute"]["done"] + minutes["last_minute"]["done"] >= 2
    listed = json.loads(status.stdout)["daemons"]  # its heartbeat, under the same ACL
    assert [x["name"] for x in listed] == [d.consumer()] and listed[0]["state"] == "alive"
    # Operator controls under the same ACL: pause, resume, cancel (a waiting job: its mark is
    # read by cancelled.lua; while marks exist, every renewal reads them too).
    assert jobd_cli("pause", "-c", c, "q").returncode == 0
    assert jobd_cli("resume", "-c", c, "q").returncode == 0
    assert jobd_cli("cancel", "-c", c, "q", "gone", "--wait", "1h").returncode == 3
    r.xadd("jobd:q", {"payload": "ok", "job_id": "gone"})
    wait_until(lambda: "cancelled (jobd cancel) before it started" in d.log(), what="the cancel")
    r.xadd("jobd:q", {"payload": "ok", "job_id": "after"})
    wait_until(lambda: pending_count(r, "jobd:q") == 0, what="jobs run while marks exist")
    log = d.log()
    assert "NOPERM" not in log and "Traceback" not in log
    assert " ERROR " not in log, "every command of every script is allowed"  # e.g. HINCRBY
    assert PASSWORD not in log


def test_password_from_a_systemd_credential(
    r: redis.Redis, acl_user: str, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    creds = tmp_path / "credentials"
    creds.mkdir()
    (creds / "redis-password").write_text(PASSWORD)
    script("h.sh", "#!/bin/sh\nexit 0\n")
    config = write_config(
        f"redis: {{url: '{{redis}}', username: {acl_user}, password_credential: redis-password}}\n"
        "queues:\n  q: {command: [./h.sh]}\n"
    )
    env = {"CREDENTIALS_DIRECTORY": str(creds)}
    d = daemon(config, env=env)
    r.xadd("jobd:q", {"payload": "x"})
    wait_until(lambda: acked_all(r, "jobd:q", 1))
    assert PASSWORD not in d.log()
    outside = jobd_cli("validate", str(config))
    assert outside.returncode == 78 and b"CREDENTIALS_DIRECTORY is not set" in outside.stdout


def test_passwords_are_masked(write_config) -> None:
    config = write_config(
        f"redis: {{url: 'redis://jobd:{PASSWORD}@127.0.0.1:6379/0'}}\nqueues:\n  q: {{command: [/bin/true]}}\n"
    )
    out = jobd_cli("validate", str(config)).stdout.decode()
    assert PASSWORD not in out and "redis://jobd:***@127.0.0.1:6379/0" in out
    from jobd.config import load

    assert PASSWORD not in repr(load(str(config)))
    direct = write_config(
        f"redis: {{password: {PASSWORD}}}\nqueues:\n  q: {{command: [/bin/true]}}\n", name="d.yaml"
    )
    assert PASSWORD not in repr(load(str(direct)))


def make_certificates(folder: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all made here."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=jobd test CA",
            "-keyout", "ca.key", "-out", "ca.crt")  # fmt: skip
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                "-keyout", f"{name}.key", "-out", f"{name}.csr")  # fmt: skip
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", f"{name}.crt")  # fmt: skip


def server_has_tls(folder: Path) -> bool:
    """A server built without TLS exits at once when asked for a TLS port."""
    try:
        result = subprocess.run(
            [find_redis_server(), "--port", "0", "--tls-port", str(free_port()), "--dir", str(folder)],
            capture_output=True, timeout=1.5,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return True  # still running: it took the option (and failed only on missing certs later)
    return b"TLS support" not in result.stdout + result.stderr


def test_tls_with_client_certificates(tmp_path: Path, script, daemon: Daemon) -> None:
    if not server_has_tls(tmp_path):
        pytest.skip(f"{find_redis_server()} was built without TLS")
    certs = tmp_path / "certs"
    certs.mkdir()
    make_certificates(certs)
    server = RedisServer(tmp_path / "tls-redis")
    server.extra = (
        "--port", "0", "--tls-port", str(server.port), "--tls-cert-file", str(certs / "server.crt"),
        "--tls-key-file", str(certs / "server.key"), "--tls-ca-cert-file", str(certs / "ca.crt"),
        "--tls-auth-clients", "yes",
    )  # fmt: skip
    server.ping_options = {
        "ssl": True, "ssl_ca_certs": str(certs / "ca.crt"),
        "ssl_certfile": str(certs / "client.crt"), "ssl_keyfile": str(certs / "client.key"),
    }  # fmt: skip
    server.start()
    try:
        script("h.sh", f"#!/bin/sh\ncat > {tmp_path}/got\n")
        config = tmp_path / "tls.yaml"
        config.write_text(
            f"redis:\n  url: rediss://127.0.0.1:{server.port}/0\n"
            "  tls: {ca_file: certs/ca.crt, cert_file: certs/client.crt, key_file: certs/client.key}\n"
            "queues:\n  q: {command: [./h.sh]}\n"
        )
        daemon(config)
        sent = jobd_cli("enqueue", "-c", str(config), "q", "over TLS")
        assert sent.returncode == 0, sent.stderr
        wait_until(
            lambda: (tmp_path / "got").exists() and (tmp_path / "got").read_text() == "over TLS"
        )
        plain = tmp_path / "plain.yaml"
        plain.write_text(
            f"redis: {{url: 'redis://127.0.0.1:{server.port}/0'}}\nqueues:\n  q: {{command: [./h.sh]}}\n"
        )
        assert jobd_cli("enqueue", "-c", str(plain), "q", "x").returncode == 69, "TLS only"
    finally:
        server.stop()
