"""Review 36m of issue 36: a client opening connections to the metrics port faster than
/metrics is answered gets every scrape closed unanswered: the cap sheds the request that has
waited *longest* for /metrics's workers, the one next in line, so a scrape moves up the queue
only to be shed once it is first.

Review 36l made a request queued for /metrics sheddable at the 64-connection cap
(``server._WSGIServer._victim``, jobd/web/server.py:376-378: ``next(c for c in
workers.queue ...)``, the queue's head) and spaced /metrics answers to 20 a second
(``paced.Spaced``). A client with 150 connections, each pipelining /metrics and reconnecting
when closed (review 36l's own flood; no token: the
loopback default, or any client when a token is set: the 401s are spaced and queued alike),
brings a newcomer whenever one of its connections is shed; each newcomer sheds the head of
the queue. A scrape's request, queued at the tail, reaches the head within ~64 newcomers and is
shed there unless its turn to be answered comes first: with newcomers arriving faster than 20 a
second, it almost never does; and each connection shed reconnects at once, a newcomer that
sheds the next head, so the queue turns over at the loop's speed. Here 9 or 10 scrapes of 10 were
closed unanswered, 0.03 to 0.08 s after they were sent, each shed as a request queued for
/metrics (62 queued behind it: instrumented `_close`).
docs/operations/monitoring.md: "a scrape among them waits its turn, about 3 s behind 64
connections"; a scrape that fails reports the daemon down (``up == 0``: JobdDown pages someone).

What should happen: a scrape is answered within SCRAPE_WITHIN whatever one client does with
its connections (suggested: shed the newest queued request, or the one of the address with
the most connections, not the one next in line).

The same with a token (a daemon listening beyond loopback): the flood, with no token, is
answered 401 (``endpoint.serve``'s refusals are spaced and queued as answers are) and still
sheds the authorised scrape, 10 of 10 closed unanswered.

The server is served in this process (``endpoint.serve``, a ``Metrics`` of 50 queues; with a
token, a stand-in page whose ``authorized`` checks the Bearer header); the flood comes from a
child process.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from support import SCRAPES, free_port, healthz, wait_until

from jobd.web import endpoint
from jobd.web.metrics import Metrics

QUEUES = 50
CONNECTIONS = 150  # past the cap of 64, each pipelining /metrics, reconnecting when closed
SCRAPES_ASKED = 10
SCRAPE_WITHIN = 10.0  # Prometheus's default scrape_timeout
SCRAPE_APART = 0.3  # between one scrape sent and the next


TOKEN = "review36m-token"


class Guarded:
    """What ``endpoint.serve`` needs of the dashboard when a token is set: the check alone."""

    allowed_hosts = ()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"no page\n"]

    def authorized(self, environ: dict[str, Any]) -> bool:
        return environ.get("HTTP_AUTHORIZATION") == f"Bearer {TOKEN}"


def scrape(port: int, timeout: float, token: str | None) -> tuple[object, float]:
    """GET /metrics as Prometheus sends it (with the token, if any): (status or error, s)."""
    began = time.monotonic()
    auth = f"Authorization: Bearer {token}\r\n".encode() if token else b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth
                      + b"Connection: close\r\n\r\n")  # fmt: skip
            data = b""
            while chunk := s.recv(1 << 16):
                data += chunk
        status: object = int(data.split(b" ", 2)[1]) if data else "closed"
    except OSError as exc:
        status = type(exc).__name__
    return status, round(time.monotonic() - began, 2)


def scrapes(port: int, token: str | None) -> list[tuple[object, float]]:
    """SCRAPES_ASKED scrapes, each on a thread of its own started SCRAPE_APART after the one
    before: each meets the flood's queue (~3 s behind 64 connections) while the next ones are
    sent, not after they are answered (one after another, they took 30 s)."""
    with ThreadPoolExecutor(SCRAPES_ASKED) as pool:
        asked = []
        for _ in range(SCRAPES_ASKED):
            asked.append(pool.submit(scrape, port, SCRAPE_WITHIN, token))
            time.sleep(SCRAPE_APART)  # spaced over the flood's turnover, not an assertion
        return [a.result() for a in asked]


@pytest.mark.parametrize("token", [None, TOKEN], ids=["no-token", "token"])
def test_a_scrape_is_answered_while_a_client_keeps_reconnecting(token: str | None) -> None:
    metrics = Metrics()
    for i in range(QUEUES):
        name = f"queue-{i}"
        metrics.watch(name, running=lambda: 0.0, free=lambda: 1.0)
        metrics.queue_state(name, {"lag": 1, "pending": 0, "oldest_pending_age": 0,
                                   "delayed": 0, "dead_lettered": 0})  # fmt: skip
    metrics.beat()
    port = free_port()
    served = endpoint.serve(metrics, f"127.0.0.1:{port}", Guarded() if token else None)
    seen: list[tuple[object, float]] = []
    try:
        wait_until(lambda: healthz(port, 2) == 200, what="the server to answer")
        assert scrape(port, SCRAPE_WITHIN, token)[0] == 200
        flood = subprocess.Popen([sys.executable, "-c", SCRAPES, str(port), str(CONNECTIONS),
                                  "120"])  # fmt: skip
        try:
            time.sleep(3)  # the flood under way (not an assertion: what the scrapes meet)
            seen = scrapes(port, token)
        finally:
            flood.kill()
            flood.wait()
    finally:
        served.shutdown()
    failed = [s for s in seen if s[0] != 200]
    assert not failed, (
        f"{len(failed)} scrapes of {SCRAPES_ASKED} failed (closed unanswered or timed out "
        f"after {SCRAPE_WITHIN} s) while a client kept {CONNECTIONS} connections asking for "
        f"/metrics ({'with' if token else 'no'} token): {seen}"
    )
