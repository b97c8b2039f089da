"""Review 36j of issue 36: a steady stream of connections that send nothing keeps every
/healthz probe waiting in the listen backlog for seconds.

Review 36i gave a new connection NEW_GRACE (0.5 s) before the 64-connection cap may close it
(``_Channel.fresh``), so that a probe's request is read at all. But while every open connection
is that fresh, ``_WSGIServer.readable`` says False: no connection is taken, the listening
socket is not even polled, and the loop sleeps until its 1 s poll timeout. Each such connection
costs nothing to make (connect, send nothing), and at the cap the server takes at most about 64
of them each time its connections age out, so a client that connects 300 times a second, sending
nothing, keeps the kernel's listen backlog (1 024) filled ahead of every other connection; a
probe's connection is queued behind hundreds of them and is taken seconds later, after the
kubelet's probe timeout (1 s by default): here /healthz took 10.3 s and 10.9 s, and 0.0 s with
NEW_GRACE set to 0. Before 36i (no grace) the same flood was taken as fast
as it came, each newcomer closing the one waiting longest, and a probe's request was read on
the loop's next turn. docs/operations/dashboard.md says "a client that connects and stalls
cannot ... keep /healthz from answering"; docs/security.md that a client on the metrics port
cannot starve /healthz: the liveness probe fails and restarts a healthy daemon, killing its
jobs.

What should happen: /healthz answers within 2 s while a client keeps connecting and sending
nothing (a fresh connection may keep its place only as long as taking the next one is not held
up: read a new connection's request as soon as it is taken, or close the oldest fresh one once
it was polled and had sent nothing, or keep room for the paths answered apart).

The server is served in this process (``server.serve_app``, the app of ``web.endpoint`` in
small); the flood comes from a child process, so it takes no turn of this one's GIL.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from support import free_port, healthz_under

from jobd.web import server

RATE = 300  # connections a second the flood makes, each sending nothing
FLOOD = """
import socket, sys, time
port, rate, end = int(sys.argv[1]), int(sys.argv[2]), time.time() + float(sys.argv[3])
held = []
while time.time() < end:
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    held.append(s)
    if len(held) > 4000:
        held.pop(0).close()
    time.sleep(1 / rate)
"""


def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok\n"]


def test_healthz_answers_while_a_client_keeps_connecting_and_sending_nothing() -> None:
    port = free_port()
    served = server.serve_app(app, f"127.0.0.1:{port}", "review36j", apart=("/healthz",))
    try:
        status, took = healthz_under(port, FLOOD, str(RATE), "20")
    finally:
        served.shutdown()
    assert status == 200, (
        f"/healthz while a client makes {RATE} connections a second that send nothing: {status} "
        f"after {took:.1f} s (NEW_GRACE {server.NEW_GRACE} s: no connection taken while all "
        f"{server.MAX_CONNECTIONS} are fresh, the probe's queued in the listen backlog)"
    )
