"""Least privilege for handlers: resource limits, another user, payloads kept out of logs."""

from __future__ import annotations

import os
import pwd
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from support import DaemonProcess, acked_all, wait_until

Daemon = Callable[..., DaemonProcess]


def test_resource_limits_are_applied_to_handlers(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script(
        "limited.py",
        f"""
        #!{sys.executable}
        import os, resource, sys, time
        what = sys.stdin.read()
        if what == "report":
            with open("{tmp_path}/limits", "w") as f:
                f.write(" ".join(str(resource.getrlimit(r)[0]) for r in
                        (resource.RLIMIT_AS, resource.RLIMIT_NOFILE, resource.RLIMIT_CPU)))
        elif what == "memory":
            try:
                block = bytearray(512 * 1024 * 1024)
            except MemoryError:
                sys.exit(3)
        elif what == "spin":
            while True:
                pass
        """,
    )
    config = write_config(
        """
        redis: {url: '{redis}'}
        queues:
          q:
            command: [./limited.py]
            concurrency: 3
            retry: {max_attempts: 1}
            resources: {address_space: 256MiB, open_files: 64, cpu_time: 1s}
        """
    )
    daemon(config)
    for what in ("report", "memory", "spin"):
        r.xadd("jobd:q", {"payload": what, "job_id": what})
    wait_until(lambda: acked_all(r, "jobd:q", 3) and r.xlen("{jobd:q}:dead") == 2)
    assert (tmp_path / "limits").read_text() == f"{256 * 2**20} 64 1"
    records = {rec[b"jobd_job_id"]: rec for _, rec in r.xrange("{jobd:q}:dead")}
    assert records[b"memory"][b"jobd_exit_code"] == b"3", "the allocation was refused"
    assert records[b"spin"][b"jobd_error"] == b"signal", "CPU time ran out"
    assert records[b"spin"][b"jobd_signal"] in (b"24", b"9")  # SIGXCPU, then SIGKILL


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder any user may enter (pytest's own temporary folders are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="jobd-run-as-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_handlers_run_as_another_user(
    r: redis.Redis, write_config, daemon: Daemon, open_dir: Path
) -> None:
    handler = open_dir / "who.sh"
    handler.write_text(
        f'#!/bin/sh\necho "$(id -u) $(id -g) $(id -G) $HOME $USER" > {open_dir}/who\n'
    )
    handler.chmod(0o755)
    config = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  q: {{command: [{handler}], cwd: {open_dir}, run_as: {{user: nobody}}}}\n"
    )
    daemon(config)
    r.xadd("jobd:q", {"payload": "x"})
    wait_until(lambda: (open_dir / "who").exists())
    uid, gid, *groups, home, user = (open_dir / "who").read_text().split()
    assert (uid, gid, user) == ("65534", "65534", "nobody")
    assert "0" not in groups, "none of root's supplementary groups"
    assert home == pwd.getpwnam("nobody").pw_dir


def test_payloads_stay_out_of_logs_unless_a_preview_is_asked_for(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    script("h.sh", "#!/bin/sh\ncat > /dev/null\n")
    config = write_config(
        """
        redis: {url: '{redis}'}
        queues:
          quiet: {command: [./h.sh]}
          preview: {command: [./h.sh], log_payload: 6}
        """
    )
    d = daemon(config)
    r.xadd("jobd:quiet", {"payload": "card=4111111111111111"})
    r.xadd("jobd:preview", {"payload": "hello world, this is long"})
    wait_until(lambda: acked_all(r, "jobd:quiet", 1) and acked_all(r, "jobd:preview", 1))
    d.wait_log("payload (first 6 bytes): b'hello '")
    assert "4111111111111111" not in d.log()
    assert "world" not in d.log()


def test_run_as_and_limits_are_validated(write_config, tmp_path: Path) -> None:
    from jobd.config import ConfigError, load

    path = write_config(
        "queues:\n  q:\n    command: [/bin/true]\n"
        "    run_as: {user: no-such-user-jobd, group: no-such-group-jobd}\n"
    )
    with pytest.raises(ConfigError) as info:
        load(str(path))
    messages = [p.format("f") for p in info.value.problems]
    assert any("run_as.user: no user 'no-such-user-jobd'" in m for m in messages)
    assert any("run_as.group: no group 'no-such-group-jobd'" in m for m in messages)
