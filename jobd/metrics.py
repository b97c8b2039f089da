"""Prometheus metrics at ``/metrics`` and liveness at ``/healthz`` (``metrics.listen``).

Names follow Prometheus conventions: ``jobd_`` prefix, ``_total`` on counters, seconds for
time; every series has a ``queue`` label. The registry is the daemon's own (no process-wide
state). ``/healthz`` answers 200 while the main loop turns over, 503 once it has been stuck
for ``STUCK_AFTER`` seconds.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

WSGIApp = Callable[..., Any]

STUCK_AFTER = 10.0
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60, 300)


@dataclass(frozen=True)
class QueueMetrics:
    """One queue's series, looked up once: ``labels()`` takes a lock and a dict lookup, and
    these are touched for every job."""

    started: Any
    succeeded: Any
    retried: Any
    reclaimed: Any
    leases_lost: Any
    duration: Any
    latency: Any


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.started = Counter("jobd_jobs_started", "Handlers started.", ["queue"], registry=r)
        self.succeeded = Counter(
            "jobd_jobs_succeeded", "Jobs acknowledged after exit 0.", ["queue"], registry=r
        )
        self.retried = Counter(
            "jobd_jobs_retried", "Failed attempts scheduled again.", ["queue"], registry=r
        )
        self.dead_lettered = Counter(
            "jobd_jobs_dead_lettered",
            "Jobs dead-lettered, by jobd_error.",
            ["queue", "error"],
            registry=r,
        )
        self.reclaimed = Counter(
            "jobd_jobs_reclaimed",
            "Entries taken over after their lease lapsed.",
            ["queue"],
            registry=r,
        )
        self.leases_lost = Counter(
            "jobd_leases_lost",
            "Entries this daemon lost to another consumer.",
            ["queue"],
            registry=r,
        )
        self.groups_recreated = Counter(
            "jobd_groups_recreated",
            "Consumer groups that vanished under a running daemon and were created again at the "
            "stream's start: every entry still in the stream is delivered again.",
            ["queue"],
            registry=r,
        )
        self.duration = Histogram(
            "jobd_handler_duration_seconds", "Handler run time.", ["queue"],
            buckets=DURATION_BUCKETS, registry=r,
        )  # fmt: skip
        self.latency = Histogram(
            "jobd_enqueue_to_start_seconds", "From the entry's stream id time to handler start.",
            ["queue"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.running = Gauge(
            "jobd_handlers_running", "Handlers running now.", ["queue"], registry=r
        )
        self.free = Gauge("jobd_slots_free", "Free handler slots.", ["queue"], registry=r)
        self.lag = Gauge(
            "jobd_queue_lag", "Entries not yet delivered to the group.", ["queue"], registry=r
        )
        self.pending = Gauge(
            "jobd_queue_pending", "Entries delivered, not yet settled.", ["queue"], registry=r
        )
        self.oldest = Gauge(
            "jobd_queue_oldest_pending_age_seconds",
            "Age of the oldest pending entry (since it was added), 0 when none.",
            ["queue"], registry=r,
        )  # fmt: skip
        self.delayed = Gauge(
            "jobd_queue_delayed", "Jobs waiting in the delayed set.", ["queue"], registry=r
        )
        self.dead = Gauge(
            "jobd_queue_dead_lettered", "Records on the dead-letter stream.", ["queue"], registry=r
        )
        self.heartbeat = time.monotonic()
        self._queues: dict[str, QueueMetrics] = {}

    def of(self, queue: str) -> QueueMetrics:
        """The queue's series (created at 0, so rates work from the first scrape)."""
        found = self._queues.get(queue)
        if found is None:
            found = self._queues[queue] = QueueMetrics(
                *(m.labels(queue=queue) for m in (self.started, self.succeeded, self.retried,
                                                   self.reclaimed, self.leases_lost,
                                                   self.duration, self.latency))
            )  # fmt: skip
        return found

    def queue_state(self, queue: str, report: dict) -> None:
        """The cluster-wide state of a queue, as ``status.queue_status`` read it."""
        self.lag.labels(queue=queue).set(report["lag"] or 0)
        self.pending.labels(queue=queue).set(report["pending"])
        self.oldest.labels(queue=queue).set(report["oldest_pending_age"] or 0)
        self.delayed.labels(queue=queue).set(report["delayed"])
        self.dead.labels(queue=queue).set(report["dead_lettered"])

    def watch(self, queue: str, running: Callable[[], float], free: Callable[[], float]) -> None:
        self.running.labels(queue=queue).set_function(running)
        self.free.labels(queue=queue).set_function(free)

    def beat(self) -> None:
        """The main loop turned over."""
        self.heartbeat = time.monotonic()

    def healthy(self) -> bool:
        return time.monotonic() - self.heartbeat < STUCK_AFTER


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass  # scrapes every few seconds would drown the log


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow page never holds up a scrape


class _IPv6Server(_Server):
    address_family = socket.AF_INET6


def serve(metrics: Metrics, listen: str, page: WSGIApp | None = None) -> WSGIServer:
    """Serve on ``listen`` (HOST:PORT) from a daemon thread; returns the server. ``page``
    (the dashboard) answers every path but /metrics and /healthz."""
    prometheus = make_wsgi_app(metrics.registry)

    def app(environ, start_response):  # type: ignore[no-untyped-def]
        path = environ.get("PATH_INFO")
        if path == "/healthz":
            ok = metrics.healthy()
            start_response(
                "200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")]
            )
            return [b"ok\n" if ok else b"main loop stuck\n"]
        if page is not None and path != "/metrics":
            return page(environ, start_response)
        return prometheus(environ, start_response)

    return serve_app(app, listen, "metrics")


def serve_app(app: WSGIApp, listen: str, name: str) -> WSGIServer:
    """Serve ``app`` on ``listen`` (HOST:PORT) from a daemon thread."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    server_class = _IPv6Server if ":" in host else _Server
    server = make_server(
        host, int(port), app, server_class=server_class, handler_class=_QuietHandler
    )
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    return server
