"""Review 32 (issue 32, the handlers' channel): reproductions of what a local process that is
no job's can still do to every job's channel. Real daemons, a private Redis."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, acked_all, queue_config, wait_until
from test_notify import lingering_socket
from test_review34h_extended_deadline_shown import running_told

Daemon = Callable[..., DaemonProcess]
ROOT = Path(__file__).resolve().parent.parent
JOBD = f"{sys.executable} -m jobd"
ENV = json.dumps({"PYTHONPATH": str(ROOT)})


def send_lingering(
    d: DaemonProcess,
    name: str,
    before: list[int] = [],  # noqa: B006
) -> tuple[socket.socket, socket.socket]:
    """A process of no job sends the daemon's channel one message carrying a lingering TCP
    socket (after the descriptors ``before``), its own copy closed before the daemon reads it
    (the daemon is held for a moment so that this is deterministic; a real sender just tries
    again until its close comes first). Returns the connection's other end, for the test to
    close at its end (until then the socket lingers)."""
    listener, peer, sender = lingering_socket()
    os.kill(d.proc.pid, signal.SIGSTOP)
    child = os.fork()
    if child == 0:
        fds = struct.pack(f"{len(before) + 1}i", *before, sender.fileno())
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendmsg([b"STATUS=x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)], 0, name)
        os._exit(0)
    sender.close()
    os.waitpid(child, 0)
    os.kill(d.proc.pid, signal.SIGCONT)
    return listener, peer


def test_one_strangers_message_makes_every_jobs_extend_and_result_unheard(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """A healthy job asks for more time (`jobd notify --extend`, within max_timeout) and says
    its result; a process of no job sent the channel one lingering descriptor before. Expected:
    the stranger's message is dropped and the job, which did everything right, is heard: its
    deadline moves as asked, and it succeeds with its result. Observed: the channel's thread is
    blocked in the close for the linger time (a minute here; SO_LINGER allows far more), every
    job's message waits unread, `jobd notify` fails, and the job's deadline and result are
    never heard.

    Made load-proof (a CI run on a loaded machine failed it): the job's timeout was 2 s and its
    extension had to be heard before then, but a Python interpreter's start (`jobd notify
    --extend` imports the config's modules: 0.15 s of CPU) took more than 2 s there, so the job
    was stopped before it could speak, whatever the channel did. Now the order is explicit: the
    daemon's record of the job shows the deadline it extended to (the timeout no longer races
    the interpreter's start: it only bounds a broken run), and the handler ends only once the
    test has seen it."""
    address = tmp_path / "address"
    script(
        "h.sh",
        f'#!/bin/sh\necho "$NOTIFY_SOCKET" > {address}\n'
        f'[ "$JOBD_JOB_ID" = first ] && exit 0\n'
        f"{JOBD} notify --extend 50s --status extended || echo 'notify failed' >&2\n"
        f"while [ ! -e {tmp_path}/go ]; do sleep 0.05; done\n"
        f"{JOBD} notify --result fine\n",
    )
    config = write_config(queue_config(
        "[./h.sh]", env=ENV, timeout="30s", max_timeout="1m", kill_grace="1s",
        retry="{max_attempts: 1}", lease="{renew_every: 300ms, reclaim_after: 3s}",
    ))  # fmt: skip
    d = daemon(config)
    r.xadd("jobd:q", {"payload": "", "job_id": "first"})
    wait_until(lambda: acked_all(r, "jobd:q", 1), what="the first job done")
    kept = send_lingering(d, "\0" + address.read_text().strip()[1:])
    r.xadd("jobd:q", {"payload": "", "job_id": "slow"})
    try:
        running = wait_until(lambda: running_told(config, "slow"), what="its extension heard")
        since, deadline = running["since"], running["deadline"]
        assert deadline - since >= 45_000, (
            f"its deadline is since + {deadline - since} ms: its 30 s timeout, not the 50 s it "
            "asked for"
        )
    finally:
        (tmp_path / "go").touch()
    wait_until(lambda: acked_all(r, "jobd:q", 2), what="the slow job settled")
    dead = [f for _, f in r.xrange("{jobd:q}:dead")] if r.exists("{jobd:q}:dead") else []
    assert not dead, f"a healthy job failed because a stranger sent one message: {dead}"
    assert "job=slow attempt=1 told jobd: " in d.log()
    assert "result 'fine'" in d.log()
    for sock in kept:
        sock.close()


def test_jobd_notify_returns_within_its_bound_when_the_channel_is_full(tmp_path: Path) -> None:
    """`jobd notify` is documented to exit 1 when its message "was not read within 5 s". A
    channel whose queue is full (its reader stuck, as above, or a job flooding it) makes its
    blocking sendmsg wait for ever: the handler hangs until its timeout kills it. Expected: exit
    1 within about 5 s. Observed: still waiting after 15 s."""
    import subprocess

    name = "\0jobd-review32-" + tmp_path.name
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:  # never read
        server.bind(name)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK) as filler:
            try:
                while True:
                    filler.sendto(b"STATUS=x", name)
            except BlockingIOError:
                pass  # the queue is full
        env = {**os.environ, "NOTIFY_SOCKET": "@" + name[1:], "PYTHONPATH": str(ROOT)}
        began = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "jobd", "notify", "--status", "y"], env=env)
        try:
            code = proc.wait(15)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            proc.kill()
            proc.wait()
        took = time.monotonic() - began
        assert code == 1, f"jobd notify: exit {code} after {took:.1f}s (documented: 1 within 5 s)"


def test_a_lingering_socket_after_eight_descriptors_does_not_block_the_channel(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """The channel took 8 descriptors a message and the kernel closed the rest inside recvmsg,
    on the channel's thread: a lingering socket sent ninth blocked it for the linger time, as
    one sent first did before its close moved off that thread. Now every descriptor the kernel
    lets a message carry is taken, and closed where no close blocks the channel: right after,
    `jobd notify` (whose pipe the channel closes once it has read its message) returns 0."""
    address = tmp_path / "address"
    script("h.sh", f'#!/bin/sh\necho "$NOTIFY_SOCKET" > {address}\n')
    d = daemon(write_config(queue_config("[./h.sh]")))
    r.xadd("jobd:q", {"payload": "", "job_id": "first"})
    wait_until(lambda: acked_all(r, "jobd:q", 1), what="the first job done")
    channel = address.read_text().strip()
    pipes = [os.pipe() for _ in range(4)]
    files = [os.open(os.devnull, os.O_RDONLY), os.open(str(address), os.O_RDONLY)]
    ends = [fd for pipe in pipes for fd in pipe] + files
    kept = send_lingering(d, "\0" + channel[1:], before=ends[:8])
    for fd in ends:
        os.close(fd)
    env = {**os.environ, "NOTIFY_SOCKET": channel, "PYTHONPATH": str(ROOT)}
    import subprocess

    done = subprocess.run([sys.executable, "-m", "jobd", "notify", "--status", "y"], env=env,
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    for sock in kept:
        sock.close()
    assert done.returncode == 0, f"the channel is blocked: {done.stderr}"
