"""Review 34b (issue 34, the handlers' channel): a descriptor in flight inside a descriptor.

The channel sets SO_LINGER to none on every socket a message brings before closing it on its
own thread ("a socket's at once, its SO_LINGER set to none first": docs/handlers-talking-back.md,
"Limits of that, said plainly"). A Unix socket brought by a message may itself hold messages
with descriptors in them (SCM_RIGHTS inside SCM_RIGHTS): its close is their last close too, and
SO_LINGER was set on the outer socket only. Real daemon, a private Redis."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, acked_all, queue_config, wait_until
from test_notify import lingering_socket

Daemon = Callable[..., DaemonProcess]
ROOT = Path(__file__).resolve().parent.parent
ENV = json.dumps({"PYTHONPATH": str(ROOT)})


def rights(*fds: int) -> list[tuple[int, int, bytes]]:
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))]


def send_nested(d: DaemonProcess, name: str) -> tuple[socket.socket, socket.socket]:
    """A process of no job sends the channel one message carrying a Unix socket in whose queue
    a lingering TCP socket is in flight (nobody else holds either). The daemon is held while
    the sender closes its copies (a real sender just tries until its close comes first, as
    ever). Returns the TCP connection's listener and peer: the socket lingers until they close."""
    listener, peer, tcp = lingering_socket()
    outer, inner_peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    inner_peer.sendmsg([b"x"], rights(tcp.fileno()))  # now in flight, in outer's queue
    tcp.close()
    inner_peer.close()
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendmsg([b"STATUS=x"], rights(outer.fileno()), 0, name)
        outer.close()
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    return listener, peer


def test_a_lingering_socket_inside_a_sent_unix_socket_blocks_the_channel(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Expected: a message of a stranger carrying a Unix socket (with anything in flight in
    it) never blocks the channel; `jobd notify` right after returns 0 at once. Observed: the
    channel's thread closes the outer socket "at once", its close is the last of the TCP socket
    in flight inside it, and that close waits out the TCP socket's linger (60 s here: SO_LINGER
    allows far more): `jobd notify` gives up after 5 s (exit 1), every job's messages wait."""
    address = tmp_path / "address"
    script("h.sh", f'#!/bin/sh\necho "$NOTIFY_SOCKET" > {address}\n')
    d = daemon(write_config(queue_config("[./h.sh]", env=ENV)))
    r.xadd("jobd:q", {"payload": "", "job_id": "first"})
    wait_until(lambda: acked_all(r, "jobd:q", 1), what="the first job done")
    channel = address.read_text().strip()
    kept = send_nested(d, "\0" + channel[1:])
    env = {**os.environ, "NOTIFY_SOCKET": channel, "PYTHONPATH": str(ROOT)}
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "jobd", "notify", "--status", "y"], env=env,
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    took = time.monotonic() - began
    for sock in kept:
        sock.close()
    assert done.returncode == 0, f"the channel is blocked ({took:.1f}s): {done.stderr}"
