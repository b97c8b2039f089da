"""The spawn seam (jobd/process/spawn.py): both ways of starting a handler give the same child, report
the same errors, and the fast one lets other threads run while the child gets to exec."""

from __future__ import annotations

import errno
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from jobd.process import spawn

Starter = Callable[..., int]
STARTERS = {
    "vfork_exec": lambda argv, env, *fds: spawn._vfork_exec(argv, spawn._encode(env), *fds),
    "posix_spawn": spawn._posix_spawn,
}


def run(start: Starter, argv: tuple[str, ...], env: dict[str, str], stdin: int | None) -> str:
    """Start argv with stdout and stderr on one pipe; its output and exit status."""
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    try:
        pid = start(argv, env, stdin, out_w, out_w)
    finally:
        os.close(out_w)
    with os.fdopen(out_r, "rb") as out:
        text = out.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, text
    return text


@pytest.mark.parametrize("name", STARTERS)
def test_the_child_has_its_group_its_descriptors_and_exactly_its_environment(name: str) -> None:
    probe = (
        'echo "pid=$$ pgid=$(ps -o pgid= -p $$ | tr -d " ")"; env | sort; read line; '
        'echo "stdin=$line"; ls /proc/$$/fd | sort -n | tr "\\n" " "'
    )
    in_r, in_w = os.pipe2(os.O_CLOEXEC)
    os.write(in_w, b"the payload\n")
    os.close(in_w)
    try:
        text = run(
            STARTERS[name], ("/bin/sh", "-c", probe), {"PATH": "/usr/bin:/bin", "A": "1"}, in_r
        )
    finally:
        os.close(in_r)
    lines = text.splitlines()
    pid, pgid = (part.split("=")[1] for part in lines[0].split())
    assert pid == pgid, "a process group of its own"
    env = {line.split("=", 1)[0] for line in lines[1:-2]}
    assert env <= {"PATH", "A", "PWD", "SHLVL", "_", "OLDPWD"}, env  # what sh itself adds
    assert {"PATH", "A"} <= env
    assert lines[-2] == "stdin=the payload"
    fds = lines[-1].split()
    assert fds[:3] == ["0", "1", "2"]
    assert str(in_r) not in fds, "the daemon's descriptors (close-on-exec) do not leak in"


@pytest.mark.parametrize("name", STARTERS)
def test_no_payload_reads_dev_null(name: str) -> None:
    text = run(STARTERS[name], ("/bin/sh", "-c", "readlink /proc/$$/fd/0; cat"), {}, None)
    assert text == "/dev/null\n"


@pytest.mark.parametrize("name", STARTERS)
def test_a_handler_that_cannot_start_is_an_oserror_with_its_errno(
    name: str, tmp_path: Path
) -> None:
    plain = tmp_path / "not-executable"
    plain.write_text("#!/bin/sh\n")
    bad_interpreter = tmp_path / "bad-interpreter"
    bad_interpreter.write_text("#!/no/such/interpreter\n")
    bad_interpreter.chmod(0o755)
    for path, code in (
        (tmp_path / "missing", errno.ENOENT),
        (plain, errno.EACCES),
        (bad_interpreter, errno.ENOENT),
    ):
        with pytest.raises(OSError) as caught:
            STARTERS[name]((str(path),), {}, None, 1, 2)
        assert caught.value.errno == code, (path, caught.value)
        assert caught.value.strerror == os.strerror(code)
    zombies = [c for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE]
    assert not zombies, "every child that failed to start was reaped"


@pytest.mark.skipif(
    spawn._fork_exec is None or sys.version_info < (3, 11, 6),
    reason="CPython releases the GIL around subprocess's vfork from 3.11.6 (gh-104372)",
)
def test_other_threads_run_while_the_child_gets_to_exec() -> None:
    """The reason for spawn.py: os.posix_spawn holds the GIL until the child has exec'd, and
    the reader and recorder could not run meanwhile. A thread that counts only while the main
    thread is inside the call counts nothing unless the call lets go of the GIL."""
    inside = threading.Event()
    done = threading.Event()
    counted = 0

    def count() -> None:
        nonlocal counted
        while not done.is_set():
            if inside.is_set():
                counted += 1

    counter = threading.Thread(target=count)
    counter.start()
    try:
        for _ in range(200):
            inside.set()
            pid = spawn.spawn(("/bin/true",), {}, {}, None, 1, 2)
            inside.clear()
            os.waitpid(pid, 0)
            if counted:
                break
    finally:
        done.set()
        counter.join()
    assert counted > 0


def test_the_jobs_own_variables_come_on_top_of_the_queues_either_way(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    queue_env = {"A": "queue", "B": "queue"}

    def start(argv: tuple[str, ...], env: dict[str, str], *fds: int | None) -> int:
        return spawn.spawn(argv, env, {"B": "job"}, *fds)  # type: ignore[arg-type]

    # What the child was given, as given: each name once.
    probe = ("/bin/sh", "-c", "tr '\\0' '\\n' < /proc/$$/environ | grep -E '^(A|B)=' | sort")
    assert run(start, probe, queue_env, None) == "A=queue\nB=job\n"

    def other_signature(*args: object) -> int:
        raise TypeError("fork_exec() takes exactly 24 arguments (23 given)")

    monkeypatch.setattr(spawn, "_fork_exec", other_signature)
    assert run(start, probe, queue_env, None) == "A=queue\nB=job\n", "os.posix_spawn instead"
    assert spawn._fork_exec is None
    assert "starting handlers with os.posix_spawn" in caplog.text
    assert run(start, probe, queue_env, None) == "A=queue\nB=job\n"


def test_encoded_environments_are_kept_for_a_bounded_number_of_mappings() -> None:
    """Each reload builds new queue environments; the encodings of old ones must not pile up."""
    spawn._encodings.clear()
    envs = [{"N": str(i)} for i in range(spawn.ENCODINGS_KEPT * 3)]
    for env in envs:
        assert spawn._encoded(env) == [f"N={env['N']}".encode()]
        assert len(spawn._encodings) <= spawn.ENCODINGS_KEPT
    assert spawn._encoded(envs[-1]) is spawn._encoded(envs[-1]), "encoded once while kept"
