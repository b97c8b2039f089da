"""Review 36k of issue 36: at the connection cap, a kept-alive connection whose next request
has already arrived is closed for a newcomer, its request unanswered.

The server reads a new connection's bytes as it is taken (``_Channel.read_now``) so that "a
request already sent is known at once and never shed as new". Nothing does that for a
connection already open: at the cap ``_WSGIServer._victim`` closes the connection "waiting
longest" by ``_Channel.waiting_since``, and a kept-alive connection between two requests counts
from its last byte (``last_activity``), so it is the first to go, even when its next request is
in its socket, not read yet. ``wasyncore.poll2`` handles a turn's ready descriptors in the order
they were registered, the listening socket first: when a newcomer and the kept-alive
connection's request arrive in one turn of the loop (a turn lasts as long as the page's workers
hold the GIL, or the daemon is stopped a moment), ``handle_accept`` closes that connection
(``_close``: will_close), its request is then read and dropped (``HTTPChannel.received``
returns at will_close), and the client gets the connection closed or reset without an answer.
Prometheus keeps its connection to /metrics open between scrapes: the scrape is shed, the one
kind of request the server promises never to shed ("never a probe's request already sent").

Here the server runs in a child process; the kept-alive /healthz connection is opened first,
63 connections each begin a request after it (the cap is 64), then the child is stopped
(SIGSTOP) while the kept-alive connection sends its next /healthz and a new connection comes,
and continued: the same turn sees both.

What should happen: the kept-alive connection's /healthz is answered (suggested fix: before
closing a victim that is idle between requests, poll it and read what it sent, as ``read_now``
does for a newcomer, and pick again when it holds a request now; or handle the listening
socket after the connections in a turn).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

from support import free_port, wait_until

CAP = 64  # jobd.web.server.MAX_CONNECTIONS
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
SERVER = """
import sys, time
from jobd.web import server
def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "3")])
    return [b"ok\\n"]
server.serve_app(app, "127.0.0.1:" + sys.argv[1], "review36k", apart=("/healthz",))
print("up", flush=True)
time.sleep(120)
"""


def answer(s: socket.socket, timeout: float = 5.0) -> bytes:
    """What the server sent back for one request, up to the end of the answer's body."""
    s.settimeout(timeout)
    got = b""
    try:
        while b"\r\n\r\n" not in got or not got.endswith(b"ok\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
    except OSError as exc:
        return got + repr(exc).encode()
    return got


def sockets_of(pid: int) -> int:
    return sum(os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
               for fd in os.listdir(f"/proc/{pid}/fd"))  # fmt: skip


def test_kept_alive_connection_request_is_not_shed_at_the_cap() -> None:
    port = free_port()
    child = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], stdout=subprocess.PIPE,
                             env={**os.environ, "PYTHONPATH": os.getcwd()})  # fmt: skip
    held: list[socket.socket] = []
    try:
        assert child.stdout is not None and child.stdout.readline() == b"up\n"
        base = sockets_of(child.pid)  # the listening socket, the trigger
        kept = socket.create_connection(("127.0.0.1", port), timeout=5)
        held.append(kept)
        kept.sendall(HEALTHZ)
        first = answer(kept)
        assert first.startswith(b"HTTP/1.1 200"), first
        time.sleep(0.3)  # the others begin their requests after its last byte
        for _ in range(CAP - 1):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET / HTTP/1.1\r\n")  # a request begun: not new, waiting
            held.append(s)
        wait_until(lambda: sockets_of(child.pid) >= base + CAP, what="the server at its cap")
        os.kill(child.pid, signal.SIGSTOP)
        try:
            kept.sendall(HEALTHZ)  # the scrape on the kept-alive connection
            newcomer = socket.socket()
            newcomer.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                newcomer.connect(("127.0.0.1", port))  # into the listen backlog
            held.append(newcomer)
            time.sleep(0.2)
        finally:
            os.kill(child.pid, signal.SIGCONT)
        second = answer(kept)
    finally:
        for s in held:
            s.close()
        child.kill()
        child.wait()
        child.stdout.close()  # type: ignore[union-attr]
    assert second.startswith(b"HTTP/1.1 200"), (
        f"/healthz sent on a kept-alive connection at the cap, arriving with a newcomer: "
        f"{second!r} (closed as the connection waiting longest, its request dropped unread)"
    )
