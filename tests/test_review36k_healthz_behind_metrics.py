"""Review 36k of issue 36: /healthz waits behind /metrics scrapes: a client that keeps asking
for /metrics on a few connections has every liveness probe time out.

Review 36h gave the paths answered without Redis workers of their own (``server.PROBE_WORKERS``,
2) so that /healthz "never waits behind the dashboard's requests"; but /healthz and /metrics
share those two workers (``endpoint.serve``: ``apart=("/healthz", "/metrics")``, one queue,
``_WSGIServer.probes``), first come first served. /metrics is not cheap: prometheus_client
renders every series at each request, ~110 ms and 260 KiB for a daemon of 50 queues (measured
here on this machine: ``generate_latest`` of a ``Metrics`` with 50 queues' series). With no
token set (the loopback default; docs/security.md: a client on the metrics port may "read the
page and metrics when no token is set") any client on the port (a job's handler runs on that
host) that keeps N connections each asking for /metrics again as soon as it has its answer (it
reads them: nothing waits unsent, so the cap never sheds them, ``_Channel.waiting_since`` is
None while a request is queued) puts about N scrapes ahead of each probe: N x 110 ms / 2. With
24 connections a /healthz took 3.4 s here (the kubelet's default probe timeout is 1 s); the
liveness probe fails and restarts a healthy daemon, killing its jobs. docs/security.md says a
client on the metrics port cannot "starve /healthz".

What should happen: /healthz answers within 2 s whatever /metrics requests are queued (suggested
fix: /healthz answered by a worker (or the loop) of its own, never queued behind /metrics; or
/metrics rendered at most once per interval and served from that copy to every request, so a
scrape costs what /healthz does).

The server is served in this process (``endpoint.serve``, a ``Metrics`` of 50 queues, no page);
the scrapes come from a child process, so they take no turn of this one's GIL.
"""

from __future__ import annotations

from support import free_port, healthz_under

from jobd.web import endpoint
from jobd.web.metrics import Metrics

QUEUES = 50
CONNECTIONS = 24  # each asking for /metrics again as soon as it has its answer
SCRAPES = """
import socket, sys, threading, time
port, n, end = int(sys.argv[1]), int(sys.argv[2]), time.time() + float(sys.argv[3])
ask = b"GET /metrics HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\n\\r\\n" * 400  # pipelined, read in turn
def scrape():
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(ask)
    while time.time() < end and s.recv(1 << 16):
        pass
    s.close()
for _ in range(n):
    threading.Thread(target=scrape, daemon=True).start()
time.sleep(max(0, end - time.time()))
"""


def test_healthz_answers_while_a_client_keeps_scraping_metrics() -> None:
    metrics = Metrics()
    for i in range(QUEUES):
        name = f"queue-{i}"
        metrics.watch(name, running=lambda: 0.0, free=lambda: 1.0)
        metrics.of(name)
        metrics.queue_state(name, {"lag": 1, "pending": 0, "oldest_pending_age": 0,
                                   "delayed": 0, "dead_lettered": 0})  # fmt: skip
    port = free_port()
    served = endpoint.serve(metrics, f"127.0.0.1:{port}")
    try:
        status, took = healthz_under(port, SCRAPES, str(CONNECTIONS), "8")  # the scrapes
    finally:
        served.shutdown()
    assert status == 200, (
        f"/healthz while a client keeps {CONNECTIONS} connections asking for /metrics "
        f"({QUEUES} queues' series): {status} after {took:.1f} s (the two probe workers "
        f"answer /metrics and /healthz first come first served)"
    )
