"""Review 36l of issue 36: past the 64-connection cap, a client keeping its connections busy
with /metrics requests keeps every /healthz probe out: it waits in the listen backlog, or is
closed unanswered.

Round 36k (d028139) gave /healthz workers of its own, so it is "answered whatever /metrics
requests are queued" (CHANGELOG). But a probe must first be taken, and the cap
(``server.MAX_CONNECTIONS``, 64) never sheds a request queued for the probes' workers
(``_Channel.waiting_since`` is None while it waits; ``_WSGIServer._victim``: "None: every one is
being answered, or queued for the probes' workers"), and /metrics is one of those paths. A
client that opens more than 64 connections, each with /metrics requests pipelined (no token: the
loopback default; each /metrics of 50 queues renders ~0.1 s on 2 workers, so 64 queued requests
are ~3 s of work, refilled as each is answered), holds every place: ``readable`` says False, so
a probe's connection waits in the backlog among the client's; when it is taken, it is the only
connection that may go (a fresh one: taken before its request arrived, the only ``_victim``
left), and the next of the client's connections in the backlog closes it unread. Here, with 150
such connections, 2 to 5 probes of 10 timed out after 2 s, were closed without an answer or
reset (3 runs; with 80 connections: 1 probe of 10 closed unanswered). docs/security.md: a client
on the metrics port cannot "starve /healthz"; the kubelet restarts a healthy daemon, killing its
jobs.

What should happen: /healthz answers within 2 s whatever clients hold the metrics port's
connections with /metrics requests (suggested fix: only /healthz's queued requests are kept at
the cap; a /metrics request waiting for its workers may be shed as a page's is, or each path
apart gets its own share of the cap; and a fresh connection is never closed for a newcomer that
brings no more than it).

The server is served in this process (``endpoint.serve``, a ``Metrics`` of 50 queues, no page);
the scrapes come from a child process, so they take no turn of this one's GIL.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any

from support import SCRAPES, free_port, healthz, wait_until

from jobd.web import endpoint, server
from jobd.web.metrics import Metrics

HEALTHZ_WITHIN = 2.0  # seconds /healthz may take (test_dashboard_security's bound)
QUEUES = 50
CONNECTIONS = 150  # past the cap of 64, each pipelining /metrics, reconnecting when closed
PROBES = 10


def probes_during_flood(port: int) -> list[tuple[object, float]]:
    """PROBES /healthz probes (status, seconds) while a child process keeps CONNECTIONS
    connections asking for /metrics."""
    seen: list[tuple[object, float]] = []
    wait_until(lambda: healthz(port, 2) == 200, what="the server to answer")
    flood = subprocess.Popen([sys.executable, "-c", SCRAPES, str(port), str(CONNECTIONS),
                              "30"])  # fmt: skip
    try:
        time.sleep(3)  # the scrapes under way (not an assertion: what the probes meet)
        for _ in range(PROBES):
            began = time.monotonic()
            status = healthz(port, HEALTHZ_WITHIN)
            seen.append((status, round(time.monotonic() - began, 2)))
            time.sleep(0.3)
    finally:
        flood.kill()
        flood.wait()
    return seen


def test_healthz_answers_while_a_client_holds_the_cap_with_metrics_requests() -> None:
    metrics = Metrics()
    for i in range(QUEUES):
        name = f"queue-{i}"
        metrics.watch(name, running=lambda: 0.0, free=lambda: 1.0)
        metrics.queue_state(name, {"lag": 1, "pending": 0, "oldest_pending_age": 0,
                                   "delayed": 0, "dead_lettered": 0})  # fmt: skip
    done = threading.Event()

    def beat() -> None:  # the main loop turning over: /healthz says 200, never 503
        while not done.wait(0.5):
            metrics.beat()

    threading.Thread(target=beat, daemon=True).start()
    port = free_port()
    served = endpoint.serve(metrics, f"127.0.0.1:{port}")
    try:
        seen = probes_during_flood(port)
    finally:
        done.set()
        served.shutdown()
    failed = [s for s in seen if s[0] != 200]
    assert not failed, (
        f"{len(failed)} /healthz probes of {PROBES} failed while a client kept {CONNECTIONS} "
        f"connections asking for /metrics ({QUEUES} queues' series): {seen}"
    )


def slow_metrics(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    """/healthz at once; any other path after 0.1 s (a /metrics of 50 queues rendered at each
    request took that), asleep: the GIL is free, only the path's workers are busy."""
    if environ.get("PATH_INFO") != "/healthz":
        time.sleep(0.1)
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok\n"]


def test_at_the_cap_a_request_queued_for_a_busy_path_is_shed_never_a_probes() -> None:
    """The server's part alone, whatever /metrics costs (fixer f36b paced its renders and
    answers, which made the test above meet fewer queued /metrics requests): a path apart
    whose workers are busy keeps requests queued at the cap; only ``kept`` ones (a probe's)
    must never be shed, the others are, so the probes are taken and answered."""
    port = free_port()
    served = server.serve_app(slow_metrics, f"127.0.0.1:{port}", "review36l",
                              apart=("/healthz", "/metrics"), kept=("/healthz",))  # fmt: skip
    try:
        seen = probes_during_flood(port)
    finally:
        served.shutdown()
    failed = [s for s in seen if s[0] != 200]
    assert not failed, (
        f"{len(failed)} /healthz probes of {PROBES} failed while a client kept {CONNECTIONS} "
        f"connections asking for a path whose workers are busy: {seen}"
    )
