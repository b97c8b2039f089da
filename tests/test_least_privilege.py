"""Least privilege (issue 17): what a handler, another local user or a browser page can reach.
Each test rebuilds a hole a security review confirmed, on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import redis
from support import wait_until


def test_descriptors_the_daemon_inherited_never_reach_a_handler(
    r: redis.Redis, write_config, script, tmp_path: Path
) -> None:
    """A daemon started with `7<secretfile` used to give every handler fd 7."""
    secret = tmp_path / "secret"
    secret.write_text("hunter2")
    fd = os.open(secret, os.O_RDONLY)
    script(
        "fds.sh",
        f"#!/bin/sh\nls /proc/self/fd > {tmp_path}/fds\ncat /proc/self/fd/{fd} > {tmp_path}/read || true\n",
    )
    config = write_config("redis: {url: '{redis}'}\nqueues:\n  q: {command: [./fds.sh]}\n")
    log = open(tmp_path / "daemon.log", "wb")  # noqa: SIM115 - closed below
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobd", "run", str(config), "--log-level", "DEBUG"],
            stdout=log, stderr=subprocess.STDOUT, pass_fds=(fd,),
        )  # fmt: skip
    finally:
        os.close(fd)
    try:
        r.xadd("jobd:q", {"payload": "x"})
        wait_until(lambda: (tmp_path / "read").exists(), what="the handler to run")
        fds = (tmp_path / "fds").read_text().split()
        assert sorted(fds, key=int)[:3] == ["0", "1", "2"] and str(fd) not in fds, fds
        assert (tmp_path / "read").read_text() == ""
        assert (
            f"descriptors inherited at start, kept from handlers: [{fd}]"
            in (tmp_path / "daemon.log").read_text()
        )
    finally:
        proc.kill()
        proc.wait()
        log.close()


def test_status_and_dlq_escape_what_others_wrote(r: redis.Redis, write_config) -> None:
    """Consumer names, job ids and stderr tails are other people's bytes: printed raw, an OSC 52
    sequence wrote the operator's clipboard and a newline forged a line. They are escaped."""
    from support import jobd_cli

    config = str(write_config("redis: {url: '{redis}'}\nqueues:\n  q: {command: [/bin/true]}\n"))
    evil = "\x1b]52;c;cm0gLXJmIH4=\x07\nFORGED"
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    r.xadd("jobd:q", {"payload": "x"})
    r.xreadgroup("jobd", evil, {"jobd:q": ">"})
    record = {"jobd_job_id": evil, "jobd_error": "exit", "jobd_stderr": f"line one\n{evil}\n"}
    r.xadd("{jobd:q}:dead", record)
    outputs = [
        jobd_cli("status", "-c", config),
        jobd_cli("dlq", "-c", config, "q", "list"),
        jobd_cli("dlq", "-c", config, "q", "show", evil),
    ]
    for run in outputs:
        assert run.returncode == 0, run
        assert b"\x1b" not in run.stdout and b"\x07" not in run.stdout, run.stdout
        assert b"\\x1b]52" in run.stdout, run.stdout
        assert not any(line.startswith(b"FORGED") for line in run.stdout.splitlines())


def test_a_reload_that_changes_the_dashboard_is_refused_not_ignored(
    r: redis.Redis, write_config, daemon, tmp_path: Path
) -> None:
    """The dashboard is built once, at start. A reload that changed its token or turned its
    actions off said "reload done" and kept the old token and the actions working."""
    import signal

    (tmp_path / "token").write_text("the-old-token-0123456789")
    config = write_config(
        "redis: {url: '{redis}'}\nmetrics: {listen: '127.0.0.1:0'}\n"
        "dashboard: {actions: true, token_file: token}\n"
        "queues:\n  q: {command: [/bin/true]}\n"
    )
    d = daemon(config)
    (tmp_path / "token").write_text("the-new-token-0123456789")
    d.signal(signal.SIGHUP)
    d.wait_log("reload refused: changing dashboard needs a restart; nothing changed")
    assert "reload done" not in d.log() and "the-new-token" not in d.log()
