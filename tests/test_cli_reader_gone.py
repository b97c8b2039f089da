"""A command whose reader goes away (`jobd dlq q show ID | head -1`, `jobd status | true`) ends
quietly with its own code (0 here), whatever the command: while it runs, what it writes after
its reader went is dropped (jobd/cli/common.py reader_may_go), not raised at the interpreter's
exit (where Python printed "Exception ignored … BrokenPipeError" and exited 120). Found by review 35aa: `jobd dlq … show |
head` ended in a BrokenPipe traceback. A real interpreter, its stdout a pipe whose reader has
closed before it writes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

CONFIG = "redis: {url: '{redis}'}\nqueues:\n  q: {command: [/bin/true]}\n"


def run_into_closed_pipe(*args: str) -> subprocess.CompletedProcess[bytes]:
    read, write = os.pipe()
    os.close(read)  # the reader has gone: every write fails with EPIPE
    try:
        return subprocess.run([sys.executable, "-m", "jobd", *args], stdout=write,
                              stderr=subprocess.PIPE, timeout=60, check=False)  # fmt: skip
    finally:
        os.close(write)


@pytest.mark.parametrize("command", [("dlq", "q", "show", "j1"), ("dlq", "q", "list"), ("status",)])
def test_a_command_whose_reader_is_gone_ends_quietly(
    r: redis.Redis, write_config: Callable[..., Path], command: tuple[str, ...]
) -> None:
    cfg = write_config(CONFIG)
    r.xadd("{jobd:q}:dead", {"payload": "x\ny\n", "job_id": "j1", "jobd_job_id": "j1",
                             "jobd_error": "exit", "jobd_failed_at": "1"})  # fmt: skip
    sub, rest = command[0], command[1:]
    done = run_into_closed_pipe(sub, "-c", str(cfg), *rest)
    assert b"Traceback" not in done.stderr and b"BrokenPipe" not in done.stderr, done.stderr
    assert done.returncode == 0, (done.returncode, done.stderr)


def test_events_follow_ends_when_its_reader_is_gone(
    r: redis.Redis, write_config: Callable[..., Path]
) -> None:
    """`jobd events --follow | head -1`: the follow ends with its reader (cli/history.py), not
    followed for ever into a pipe nobody reads (reader_may_go is not around `events`)."""
    cfg = write_config(CONFIG)
    r.execute_command("XADD", "{jobd:q}:events", "*", "event", "done", "job", "j1")
    done = run_into_closed_pipe("events", "-c", str(cfg), "q", "--follow")
    assert b"Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0, (done.returncode, done.stderr)
