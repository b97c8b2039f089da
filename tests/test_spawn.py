"""The spawn seam (jobd/process/spawn.py): every way of starting a handler gives the same child
and reports the same errors; the fastest returns before the child has exec'd, and a signal that
reaches the child before its exec never runs a handler of the daemon's; the vfork one lets other
threads run while the child gets to exec."""

from __future__ import annotations

import errno
import json
import os
import platform
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from support import wait_until
from test_hardening import open_dir  # noqa: F401 - a fixture: a folder nobody may enter

from jobd.process import spawn
from jobd.process.deadline import LAPSED, Lapsed

Starter = Callable[..., int]
# Where the C extension must have been built with the package (setup.py): its tests never skip.
NATIVE = sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64")


def clone_exec(
    argv: tuple[str, ...], env: dict[str, str], *fds: int | None, deadline: int | None = None
) -> int:
    """``_clone_exec`` as a starter that raises what the child reported, like the others: it
    waits for the child to exit without reaping it (the caller does), then reads the report."""
    low = [os.dup(fd) if fd is not None and fd < 3 else None for fd in fds]
    given = [fd if dup is None else dup for fd, dup in zip(fds, low, strict=True)]
    try:
        pid, report = spawn._clone_exec(argv, spawn._encode(env), *given, deadline)  # type: ignore[arg-type]
    finally:
        for fd in low:
            if fd is not None:
                os.close(fd)
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    error = spawn.start_error(report)
    if error is not None:
        os.waitpid(pid, 0)
        raise error
    return pid


STARTERS = {
    "vfork_exec": lambda argv, env, *fds, deadline=None: spawn._vfork_exec(
        argv, spawn._encode(env), *fds, deadline
    ),
    "posix_spawn": spawn._posix_spawn,
}
if spawn._clonexec is not None or NATIVE:
    STARTERS["clone_exec"] = clone_exec


def test_the_c_extension_was_built_where_it_can_be() -> None:
    if not NATIVE:
        pytest.skip(
            f"the C extension is built on x86_64 and aarch64 Linux only, not {platform.machine()}"
        )
    assert spawn._clonexec is not None, "pip install -e . builds jobd.process._clonexec (setup.py)"


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
def test_the_child_has_its_session_its_descriptors_and_exactly_its_environment(name: str) -> None:
    probe = (
        'echo "pid=$$ pgid=$(ps -o pgid= -p $$ | tr -d " ") sid=$(ps -o sid= -p $$ | tr -d " ")"; '
        "env | sort; read line; "
        'echo "stdin=$line"; grep -E "^SigBlk" /proc/$$/status | tr -d "\\t" | '
        'tr ":\\n" "= " | sed "s/ $/\\n/"; ls /proc/$$/fd | sort -n | tr "\\n" " "'
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
    assert lines.pop(-2) == "SigBlk=0000000000000000", "no signal blocked"
    pid, pgid, sid = (part.split("=")[1] for part in lines[0].split())
    assert pid == pgid == sid, "a session (and process group) of its own"
    env = {line.split("=", 1)[0] for line in lines[1:-2]}
    assert env <= {"PATH", "A", "PWD", "SHLVL", "_", "OLDPWD"}, env  # what sh itself adds
    assert {"PATH", "A"} <= env
    assert lines[-2] == "stdin=the payload"
    fds = lines[-1].split()
    assert fds[:3] == ["0", "1", "2"]
    assert str(in_r) not in fds, "the daemon's descriptors (close-on-exec) do not leak in"


def boottime_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


@pytest.mark.parametrize("name", STARTERS)
def test_a_start_past_its_deadline_never_execs_and_says_the_lease_lapsed(
    name: str, tmp_path: Path
) -> None:
    """Issue 32: a start carries its job's lease deadline (CLOCK_BOOTTIME ns); a handler that
    would get to its exec past it never runs (the clone's child checks it itself, just before
    its execve; the others just before their fork), and the start says so with ``Lapsed``, not
    an OSError, whatever the errno. With a deadline still ahead, it runs as ever."""
    made = tmp_path / "ran"
    argv = ("/bin/sh", "-c", f"touch {made}")
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    try:
        with pytest.raises(Lapsed, match="lease lapsed before exec"):
            STARTERS[name](argv, {}, None, out_w, out_w, deadline=boottime_ns())
        assert not made.exists(), "the handler never ran"
        pid = STARTERS[name](argv, {}, None, out_w, out_w, deadline=boottime_ns() + 60 * 10**9)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(out_r)
        os.close(out_w)
    assert os.waitstatus_to_exitcode(status) == 0
    assert made.exists(), "a deadline ahead: it ran"


def test_a_clone_child_past_its_deadline_exits_reporting_a_code_no_errno_can_be(
    tmp_path: Path,
) -> None:
    """The check is the child's own (no check in the caller: a stall between the call and the
    child's exec is seen too, tests/test_leases.py), told on the report pipe as code 0x10000
    (errnos are below 4096); the child exits 127 without exec'ing."""
    clone_starts()
    made = tmp_path / "ran"
    pid, report = spawn._clone_exec(
        ("/bin/sh", "-c", f"touch {made}"), [], None, *pipe_ends(), boottime_ns()
    )
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 127
    assert isinstance(spawn.start_error(report), Lapsed)
    assert not made.exists()
    assert isinstance(spawn._reported_error(b"OSError:%x:" % LAPSED), Lapsed)


def test_a_subprocess_start_past_its_deadline_never_forks(tmp_path: Path) -> None:
    """A queue with a folder of its own starts by ``subprocess.Popen``, which runs no check in
    its child: the deadline is checked just before it."""
    from dataclasses import replace

    from jobd.config import load
    from jobd.process import launch

    config = Path(__file__).parent.parent / "config" / "example.yaml"
    queue = next(iter(load(str(config)).queues.values()))
    made = tmp_path / "ran"
    argv = ("/bin/sh", "-c", f"touch {made}")
    queue = replace(queue, command=argv, argv=argv, cwd=str(tmp_path), env={})
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    try:
        with pytest.raises(Lapsed):
            launch.start(queue, os.getcwd(), {}, None, out_w, out_w, None, boottime_ns())
        assert not made.exists(), "the handler never ran"
        pid, _, _, _ = launch.start(
            queue, os.getcwd(), {}, None, out_w, out_w, None, boottime_ns() + 60 * 10**9
        )
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(out_r)
        os.close(out_w)
        spawn.OOM.give_back(force=True)
    assert os.waitstatus_to_exitcode(status) == 0
    assert made.exists()


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
def test_other_threads_run_while_the_vfork_child_gets_to_exec() -> None:
    """The reason for the vfork way: os.posix_spawn holds the GIL until the child has exec'd, and
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
            pid = spawn._vfork_exec(("/bin/true",), [], None, 1, 2)
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
        return spawn.spawn(argv, env, {"B": "job"}, *fds)[0]  # type: ignore[arg-type]

    # What the child was given, as given: each name once.
    probe = ("/bin/sh", "-c", "tr '\\0' '\\n' < /proc/$$/environ | grep -E '^(A|B)=' | sort")
    assert run(start, probe, queue_env, None) == "A=queue\nB=job\n"

    def other_signature(*args: object) -> int:
        raise TypeError("fork_exec() takes exactly 24 arguments (23 given)")

    monkeypatch.setattr(spawn, "_clonexec", None)  # as where the C extension is not built
    assert run(start, probe, queue_env, None) == "A=queue\nB=job\n", "vfork"
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


def clone_starts() -> None:
    if spawn._clonexec is None:
        assert not NATIVE, "the C extension was not built (setup.py)"
        pytest.skip(f"no C extension on {sys.platform} {platform.machine()}")


def before_exec(pid: int) -> bool:
    """Whether ``pid`` is still the daemon's clone (its executable this Python's)."""
    try:
        return os.readlink(f"/proc/{pid}/exe") == os.readlink("/proc/self/exe")
    except OSError:
        return False


@pytest.fixture
def one_cpu() -> object:
    """This thread and the children it starts on one CPU: a child runs only when this thread
    lets it, so a start that does not wait for the exec returns before it."""
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    yield
    os.sched_setaffinity(0, cpus)


def test_a_clone_start_returns_before_the_child_has_execd(one_cpu: object) -> None:
    """The point of _clonexec: the loop goes on while the child gets to exec (vfork returns
    only after it, so this never sees a child before its exec that way)."""
    clone_starts()
    early = 0
    for _ in range(50):
        pid, report = spawn._clone_exec(("/bin/sleep", "5"), [], None, *pipe_ends())
        early += before_exec(pid)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        assert spawn.start_error(report) is None
    assert early > 0, "every start waited for its child's exec"
    assert spawn._clonexec.in_flight() == 0, "each child's stack is freed once it has left it"


_pipes: list[int] = []


def pipe_ends() -> tuple[int, int]:
    """stdout and stderr for a child: a pipe's write end (above 2), kept open for the test."""
    if not _pipes:
        r, w = os.pipe2(os.O_CLOEXEC)
        _pipes.extend((r, w))
    return _pipes[1], _pipes[1]


def test_a_signal_before_exec_never_runs_a_handler_of_the_daemon(one_cpu: object) -> None:
    """A clone shares the daemon's memory until its exec: a signal handler of the daemon's
    running there would set the daemon's own flags (and write to its wakeup pipe), and the
    daemon would act on a SIGTERM sent to a handler's group. The child takes every signal at
    its default action before it can receive one."""
    clone_starts()
    caught: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: caught.append(signum))
    wake_r, wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    old_wakeup = signal.set_wakeup_fd(wake_w)
    hit = 0
    try:
        for _ in range(100):
            pid, report = spawn._clone_exec(("/bin/sleep", "5"), [], None, *pipe_ends())
            hit += before_exec(pid)
            os.kill(pid, signal.SIGUSR1)  # maybe before its setsid (a stop signals it too)
            _, status = os.waitpid(pid, 0)
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGUSR1
            assert spawn.start_error(report) is None
        for _ in range(100):  # let pending Python-level handlers run, if any were tripped
            pass
        signal.pthread_kill(threading.main_thread().ident, 0)  # type: ignore[arg-type]
    finally:
        signal.set_wakeup_fd(old_wakeup)
        signal.signal(signal.SIGUSR1, previous)
    with pytest.raises(BlockingIOError):
        os.read(wake_r, 100)
    os.close(wake_r)
    os.close(wake_w)
    assert hit > 0, "no child was signalled before its exec: the test proved nothing"
    assert caught == [], "the daemon's handler ran for a signal sent to a child"


@pytest.fixture
def own_score() -> object:
    """This process's OOM score, put back after the test (which takes others for its
    children, as the daemon does)."""
    with open("/proc/self/oom_score_adj") as f:
        before = f.read().strip()
    yield int(before)
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write(before)


def score_of(pid: int | str) -> int:
    with open(f"/proc/{pid}/oom_score_adj") as f:
        return int(f.read())


def start_sleeper() -> tuple[int, int]:
    return spawn._clone_exec(("/bin/sleep", "30"), [], None, *pipe_ends())


def end(*children: tuple[int, int]) -> None:
    for pid, report in children:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(report)


def test_a_refused_score_starts_its_handler_with_the_daemons_own_not_the_one_held(
    own_score: int,
) -> None:
    """From the review: held across starts, a queue's score reached the next handler of a
    queue whose own score the kernel refused (it should keep the daemon's)."""
    clone_starts()
    score = spawn.OomScore()
    score.refused.add(own_score - 1)  # as after a refusal (no CAP_SYS_RESOURCE)
    with spawn.LOCK:
        score.take(own_score + 100)
        first = start_sleeper()
        score.take(own_score - 1)
        second = start_sleeper()
    try:
        assert score_of(first[0]) == own_score + 100
        assert score_of(second[0]) == own_score, "the refused queue keeps the daemon's score"
        assert score_of("self") == own_score
    finally:
        end(first, second)


def test_a_child_stuck_before_its_exec_holds_no_score_for_ever(
    own_score: int, one_cpu: object
) -> None:
    """From the review: a child stopped before its exec (or exec'ing from a hung file system)
    kept the daemon at the handlers' score for good, and made every change of score wait."""
    clone_starts()
    score = spawn.OomScore()
    for _ in range(50):  # until one is stopped before its exec (on one CPU: nearly always)
        with spawn.LOCK:
            score.take(own_score + 100)
            stuck = start_sleeper()
        os.kill(stuck[0], signal.SIGSTOP)
        if before_exec(stuck[0]):
            break
        end(stuck)
    else:
        pytest.fail("no child was stopped before its exec")
    try:
        wait_until(score.give_back, what="the daemon's own score back")
        assert score_of("self") == own_score
    finally:
        end(stuck)


def test_an_operators_change_of_the_daemons_score_is_kept(own_score: int) -> None:
    """From the review: the score read before the first start was written back over an
    operator's change made while a handler's was held."""
    clone_starts()
    score = spawn.OomScore()
    with spawn.LOCK:
        score.take(own_score + 100)
        child = start_sleeper()
    try:
        wait_until(lambda: not before_exec(child[0]), what="its exec (until then it shares ours)")
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(own_score + 50))  # the operator
        wait_until(score.give_back, what="the score given back")
        assert score_of("self") == own_score + 50
        assert score_of(child[0]) == own_score + 100
    finally:
        end(child)


@pytest.mark.parametrize("memory", [None, 64 << 20])
def test_a_handler_whose_cgroup_caps_memory_is_started_waiting_for_its_exec(
    memory: int | None, monkeypatch: pytest.MonkeyPatch, own_score: int
) -> None:
    """From the review: a child before its exec shares the daemon's memory, and the kernel's
    OOM killer, which passes over a vfork child, does not pass over a clone: picked in its
    cgroup (a memory.max written before its exec, and exec needing more), it takes the daemon
    with it. So where the cgroup caps memory the start waits for the exec, and the limit comes
    after (this host may have no memory controller to show the kill itself)."""
    import contextlib
    from dataclasses import replace

    from jobd.config import load
    from jobd.config.types import Resources
    from jobd.process import launch

    waited: list[bool] = []

    def recording(
        *args: object, wait: bool = False, deadline: int | None = None
    ) -> tuple[int, None]:
        waited.append(wait)
        return 1, None

    class Tree:
        @contextlib.contextmanager
        def spawning(self, resources: Resources) -> Iterator[str]:
            yield "its cgroup"

    monkeypatch.setattr(spawn, "spawn", recording)
    monkeypatch.setattr(spawn, "OOM", spawn.OomScore())  # (the score it takes: own_score's)
    config = Path(__file__).parent.parent / "config" / "example.yaml"
    queue = next(iter(load(str(config)).queues.values()))
    queue = replace(queue, resources=replace(queue.resources, memory=memory))
    launch.start(queue, queue.cwd, {}, None, 3, 4, Tree())  # type: ignore[arg-type]
    launch.start(queue, queue.cwd, {}, None, 3, 4, None)
    assert waited == [memory is not None, False]


def test_a_child_started_at_the_daemons_own_score_keeps_it_when_another_is_taken(
    own_score: int, one_cpu: object
) -> None:
    """From the review: the kernel gives every process sharing the daemon's memory the score the
    daemon writes for itself. A handler of a queue at the daemon's own score (nothing taken) was
    still before its exec when the next queue's score was taken: it ran with that one."""
    clone_starts()
    score = spawn.OomScore()
    children = []
    try:
        for _ in range(20):
            with spawn.LOCK:
                score.take(own_score)
                first = start_sleeper()
                score.take(own_score + 100)
                second = start_sleeper()
            children += [first, second]
            pids = (first[0], second[0])
            wait_until(lambda p=pids: not any(before_exec(pid) for pid in p), what="their exec")
            assert (score_of(first[0]), score_of(second[0])) == (own_score, own_score + 100)
    finally:
        end(*children)


def test_a_stdin_of_0_is_started_too() -> None:
    """Descriptors 0 to 2 go to vfork (the clone takes only others): a stdin of 0 was taken
    for "no stdin" and given to the clone, which refused it (ValueError)."""
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    try:
        pid, report = spawn.spawn(("/bin/true",), {}, {}, 0, out_w, out_w)
    finally:
        os.close(out_w)
        os.close(out_r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert report is None, "waited for its exec"


# Run as the shipped unit runs jobd: an unprivileged user, non-dumpable. A child of the start
# exec's a copy of sleep that user may execute but not read, so the kernel keeps it non-dumpable
# after its exec too: kcmp is refused on it before and after. Meanwhile another process holds
# a copy of the report pipe's write end (as one forked at the wrong instant would): nothing
# proves the child has left the daemon's memory, and the safeguard must not take it as gone.
AS_THE_UNIT = """
import ctypes, errno, os, signal, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE 0, as jobd makes itself
from jobd.process import _clonexec, spawn

# The premise: kcmp on a non-dumpable process, unprivileged, is refused.
child = os.fork()
if child == 0:
    time.sleep(30)
    os._exit(0)
SYS_kcmp, KCMP_VM = 312, 1
assert libc.syscall(SYS_kcmp, os.getpid(), child, KCMP_VM, 0, 0) == -1
assert ctypes.get_errno() == errno.EPERM, ctypes.get_errno()
os.kill(child, signal.SIGKILL)
os.waitpid(child, 0)

holders = []
real_pipe2 = os.pipe2
def pipe2(flags):
    r, w = real_pipe2(flags)
    holders.append(subprocess.Popen(["/bin/sleep", "60"], pass_fds=(w,)))
    return r, w
os.pipe2 = pipe2
out_r, out_w = real_pipe2(os.O_CLOEXEC)
pid, report = spawn._clone_exec((sys.argv[1], "30"), [], None, out_w, out_w)
os.pipe2 = real_pipe2
while b"(xsleep)" not in open(f"/proc/{pid}/stat", "rb").read():  # it has exec'd
    time.sleep(0.01)
print("in flight while unproven:", _clonexec.in_flight(), _clonexec.settle(0.0, 60.0))
holders[0].kill()
holders[0].wait()
print("in flight once proven:", _clonexec.in_flight(), _clonexec.settle(5.0, 60.0))
os.kill(pid, signal.SIGKILL)
os.waitpid(pid, 0)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="becoming another user needs root")
def test_the_oom_safeguard_holds_in_an_unprivileged_non_dumpable_daemon(
    request: pytest.FixtureRequest,
) -> None:
    """From the review: under the shipped unit the kernel refuses kcmp, and the safeguard took
    the refusal for "the child has left the daemon's memory" as soon as its exec began: a score
    written then reached a child still before its exec. A refusal proves nothing now; the
    report pipe's end (the child's copy closed by its exec) does."""
    clone_starts()
    import shutil
    import subprocess

    from test_hardening import nobody_prefix

    folder: Path = request.getfixturevalue("open_dir")
    (folder / "mnt").mkdir()
    xsleep = folder / "xsleep"
    shutil.copy("/bin/sleep", xsleep)
    xsleep.chmod(0o711)  # executable, not readable, by nobody
    done = subprocess.run(
        [*nobody_prefix(folder / "mnt"), sys.executable, "-c", AS_THE_UNIT, str(xsleep)],
        capture_output=True, timeout=60, cwd=folder,
        env={**os.environ, "PYTHONPATH": str(Path(spawn.__file__).parents[2])},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    lines = done.stdout.decode().splitlines()
    assert lines == ["in flight while unproven: 1 False", "in flight once proven: 0 True"]


@pytest.mark.skipif(os.geteuid() != 0, reason="becoming another user needs root")
def test_every_handler_of_an_unprivileged_non_dumpable_daemon_starts_with_its_queues_score(
    request: pytest.FixtureRequest, r: object, redis_server: object
) -> None:
    """The whole daemon as the units run it (nobody, non-dumpable: kcmp refused): handlers of
    two queues with other scores, started back to back, each with its own queue's."""
    import redis as redis_module
    from test_hardening import nobody_prefix, running, write

    folder: Path = request.getfixturevalue("open_dir")
    (folder / "mnt").mkdir()
    show = "[/bin/sh, -c, 'echo $JOBD_QUEUE $(cat /proc/self/oom_score_adj)']"
    config = write(folder / "jobd.yaml", f"""
        redis: {{url: '{redis_server.url}'}}
        queues:
          a: {{command: {show}, concurrency: 4, resources: {{oom_score_adj: 300}}}}
          b: {{command: {show}, concurrency: 4, resources: {{oom_score_adj: 600}}}}
        """)  # type: ignore[attr-defined]  # fmt: skip
    os.chown(folder, 65534, 65534)
    argv = [*nobody_prefix(folder / "mnt"), sys.executable, "-m", "jobd", "run", str(config)]
    client = redis_module.Redis(port=redis_server.port)  # type: ignore[attr-defined]
    with running(argv, folder / "daemon.log", {**os.environ}) as proc:
        assert psutil.Process(proc.pid).uids().real == 65534
        for i in range(40):
            client.xadd(f"jobd:{'ab'[i % 2]}", {"payload": "x", "job_id": f"j{i}"})
        wait_until(
            lambda: sum(client.hlen(f"{{jobd:{q}}}:history") for q in "ab") == 40,
            what="every job done",
        )
        seen = {
            json.loads(raw.splitlines()[-1])["stdout"].strip()
            for q in "ab"
            for raw in client.hvals(f"{{jobd:{q}}}:history")
        }
    client.close()
    assert seen == {"a 300", "b 600"}, seen
