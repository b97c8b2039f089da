"""Review 36i of issue 36: a client whose 64 connections each wait for a dashboard worker gets
every /healthz probe's connection closed unanswered.

The server takes at most 64 connections (``server.MAX_CONNECTIONS``); at the cap, ``_room``
closes the one "waiting longest" to make room, on every turn of the loop. A connection whose
request is queued for a worker counts as being answered (``_Channel.waiting_since``: None
whenever ``requests`` is not empty), and one just accepted whose request has not been read yet
counts as waiting. So once 63 connections hold requests queued for the dashboard's workers, each
new connection (a liveness probe's) is accepted, found the only one waiting, and closed on the
next turn before its request is read: the probe gets its connection reset, or closed without an
answer. While Redis is unreachable the 4 dashboard workers each wait up to the 10 s socket
timeout a request, and 64 requests queued behind them last about 64 / 4 × 10 s: any client on
the metrics port (the page needs no token on loopback; a job's handler runs there too) can have
every /healthz of that time fail, and the liveness probe restart a healthy daemon, killing its
jobs. Review 36h gave /healthz workers of its own so that it "never waits behind the page's
requests"; docs/security.md says a client on the metrics port cannot "starve /healthz".

What should happen: /healthz answers within 2 s however many connections hold requests queued
for the dashboard's workers (a connection is not closed before its first request was read; a
queued request is waiting, not answered, so such a connection can go for a newcomer; or the cap
is kept per kind of request, or room kept for the paths answered apart).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import psutil
import redis
from faultproxy import FaultProxy
from support import DaemonProcess, free_port, wait_until
from test_dashboard_security import answers, request

Daemon = Callable[..., DaemonProcess]
CAP = 64  # jobd.web.server.MAX_CONNECTIONS
HEALTHZ_WITHIN = 2.0  # seconds /healthz may take (test_dashboard_security's bound)
PAGE = b"GET /api/summary HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def taken(pid: int, port: int) -> int:
    """The connections process ``pid`` holds on its listening ``port``."""
    return sum(c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED
               for c in psutil.Process(pid).net_connections("tcp"))  # fmt: skip


def test_healthz_answers_while_every_connection_waits_for_a_dashboard_worker(
    r: redis.Redis, write_config: Any, daemon: Daemon, redis_server: Any
) -> None:
    port = free_port()
    clients: list[socket.socket] = []
    with FaultProxy(redis_server.port) as proxy:
        config = write_config(
            f"redis: {{url: '{proxy.url}'}}\nqueues:\n  q0: {{command: [/bin/true]}}\n"
            f"metrics: {{listen: '127.0.0.1:{port}'}}\n"
        )
        d = daemon(config)
        wait_until(lambda: answers(port), what="the metrics server to answer")
        proxy.blackhole(None)  # Redis cut off: the dashboard's workers wait on it
        try:
            for _ in range(CAP):
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                s.sendall(PAGE)
                clients.append(s)
            # The server took them (one may be closed again at the cap: 63 are enough), counted
            # as its connections on the port (not all its descriptors: its Redis connections,
            # cut off, come and go meanwhile; the stop CI's Valkey phase saw the count fall).
            wait_until(lambda: taken(d.proc.pid, port) >= CAP - 1,
                       what="the server to take the connections")  # fmt: skip
            try:
                healthz: int | str = request(port, "/healthz", timeout=HEALTHZ_WITHIN)[0]
            except OSError as exc:
                healthz = repr(exc)
        finally:
            for s in clients:
                s.close()
            proxy.restore()
    assert healthz == 200, (
        f"/healthz with {CAP} connections' requests queued for the page's workers: {healthz}"
    )
