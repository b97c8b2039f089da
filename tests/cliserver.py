"""`python -m jobd ARGS` for the tests, without paying Python's start and jobd's imports each
time (~0.3 s of CPU a command, alone; more under the suite's workers; a run makes a thousand).

A server process of each test process imports `jobd.cli` once and forks a child for each
command. The child takes the caller's stdin, stdout and stderr (passed over a Unix socket),
its environment, working folder and arguments, runs jobd/__main__.py as `python -m jobd` does
(``runpy``), and exits with its status, which the server reports when it reaps it (a signal's
death as subprocess says it: minus the signal). What the imports cannot see from a child is
left to a real interpreter (``run`` falls back to ``subprocess.run``): a `jobd run` (a daemon:
its start is what daemon tests measure), and an environment whose interpreter settings differ
from the server's (PYTHON*, LD_*: read at the interpreter's start, not by jobd).

    python tests/cliserver.py SOCKET    # the server (started by ``run``, ended with its caller)
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence

Started = tuple[subprocess.Popen[bytes], str, dict[str, str]]
_started: Started | None = None
_starting = threading.Lock()  # commands asked from several threads at once: one server
_INTERPRETER = ("PYTHON", "LD_")  # variables an interpreter reads as it starts


# -- the caller's side ---------------------------------------------------------------------------


def run(
    args: Sequence[str], stdin: bytes | None, env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess[bytes]:
    """What ``subprocess.run([python, -m, jobd, *args], input=stdin, capture_output=True,
    timeout=timeout, env=env)`` returns (or raises), run by a child of the server."""
    cmd = [sys.executable, "-m", "jobd", *args]
    server = _server() if "run" not in args[:1] else None
    if server is None or _differs(env, server[2]):
        return subprocess.run(cmd, input=stdin, capture_output=True, timeout=timeout, env=env)
    in_r, in_w = os.pipe() if stdin is not None else (None, None)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.connect(server[1])
        request = {"args": list(args), "env": dict(env), "cwd": os.getcwd()}
        fds = [0 if in_r is None else in_r, out_w, err_w]
        socket.send_fds(sock, [json.dumps(request).encode()], fds)
        for fd in (in_r, out_w, err_w):
            if fd is not None:
                os.close(fd)
        pid = int(sock.recv(64))
        out, err, code = _communicate(sock, in_w, stdin or b"", out_r, err_r, timeout)
    if code is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        raise subprocess.TimeoutExpired(cmd, timeout, out, err)
    return subprocess.CompletedProcess(cmd, code, out, err)


def _differs(env: Mapping[str, str], served: Mapping[str, str]) -> bool:
    names = {k for k in (*env, *served) if k.startswith(_INTERPRETER)}
    return any(env.get(k) != served.get(k) for k in names)


def _communicate(
    sock: socket.socket, in_w: int | None, data: bytes, out_r: int, err_r: int, timeout: float
) -> tuple[bytes, bytes, int | None]:
    """Write ``data`` to the child's stdin, read its stdout and stderr to their ends, and its
    exit status from the server; the status None when ``timeout`` passed first."""
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    code: int | None = None
    sel = selectors.DefaultSelector()
    for fd in (out_r, err_r):
        sel.register(fd, selectors.EVENT_READ)
    sel.register(sock, selectors.EVENT_READ)
    if in_w is not None:
        os.set_blocking(in_w, False)
        sel.register(in_w, selectors.EVENT_WRITE)
    end = time.monotonic() + timeout
    try:
        while sel.get_map():
            left = end - time.monotonic()
            if left <= 0:
                break
            for key, _ in sel.select(left):
                if key.fileobj is sock:
                    reply = sock.recv(64)
                    code = int(reply) if reply else -signal.SIGKILL
                    sel.unregister(sock)
                elif key.fd == in_w:
                    try:
                        data = data[os.write(in_w, data[:65536]) :]
                    except BrokenPipeError:
                        data = b""
                    if not data:
                        sel.unregister(in_w)
                        os.close(in_w)
                        in_w = None
                elif chunk := os.read(key.fd, 65536):
                    chunks[key.fd].append(chunk)
                else:
                    sel.unregister(key.fd)
    finally:
        sel.close()
        for fd in (in_w, out_r, err_r):
            if fd is not None:
                os.close(fd)
    done = code is not None and time.monotonic() <= end
    return b"".join(chunks[out_r]), b"".join(chunks[err_r]), code if done else None


def _server() -> Started | None:
    """This process's server, started at the first command; None where it cannot start."""
    with _starting:
        if _started is None or _started[0].poll() is not None:
            _start()
        return _started


def _start() -> None:
    global _started
    _started = None
    folder = tempfile.mkdtemp(prefix="jobd-cli-")
    path = os.path.join(folder, "socket")
    proc = subprocess.Popen([sys.executable, __file__, path], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    end = time.monotonic() + 30
    while not os.path.exists(path) and proc.poll() is None and time.monotonic() < end:
        time.sleep(0.01)
    if not os.path.exists(path):
        proc.kill()
        proc.wait()
        return
    atexit.register(_stop, proc, folder)
    _started = (proc, path, dict(os.environ))


def _stop(proc: subprocess.Popen[bytes], folder: str) -> None:
    proc.kill()
    proc.wait()
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(folder, "socket"))
        os.rmdir(folder)


# -- the server ----------------------------------------------------------------------------------


def serve(path: str) -> None:
    """Fork a child for each command asked on ``path``; report each one's exit status to the
    connection that asked for it; end when the process that started it has."""
    import importlib
    import pkgutil

    import jobd.cli

    for module in pkgutil.iter_modules(jobd.cli.__path__, "jobd.cli."):
        importlib.import_module(module.name)
    importlib.import_module("jobd.store.store")
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path + ".new")
    listener.listen(64)
    os.rename(path + ".new", path)  # whole: bound and listening
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    signal.set_wakeup_fd(wake_w.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)
    asked: dict[int, socket.socket] = {}
    while os.getppid() == parent:
        ready = select.select([listener, wake_r], [], [], 1.0)[0]
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                while wake_r.recv(4096):
                    pass
            _reap(asked)
        if listener in ready:
            conn, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            pid = os.fork()
            if pid == 0:
                os._exit(_child(json.loads(message), fds, (listener, wake_r, wake_w, conn)))
            for fd in fds:
                os.close(fd)
            conn.sendall(b"%d" % pid)
            asked[pid] = conn


def _reap(asked: dict[int, socket.socket]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = asked.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(b"%d" % os.waitstatus_to_exitcode(status))
            conn.close()


def _child(request: dict, fds: list[int], server: tuple[socket.socket, ...]) -> int:
    """In the forked child: become `python -m jobd ARGS` as the caller asked; its exit status."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for s in server:
            s.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in set(fds) - {0, 1, 2}:
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["-m", *request["args"]]  # runpy puts the module's path first
        code = _main()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    return code


def _main() -> int:
    """jobd/__main__.py run as `-m jobd` runs it, and the interpreter's exit after it."""
    import atexit as exits
    import runpy
    import threading
    import traceback

    try:
        runpy.run_module("jobd", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # as the interpreter reports it
        traceback.print_exc()
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads, as at exit
    exits._run_exitfuncs()
    return code


if __name__ == "__main__":
    serve(sys.argv[1])
