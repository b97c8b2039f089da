"""Prometheus metrics at ``/metrics`` and liveness at ``/healthz`` (``serve``).

Names follow Prometheus conventions: ``jobd_`` prefix, ``_total`` on counters, seconds for
time; every series has a ``queue`` label. The registry is the daemon's own (no process-wide
state). ``/healthz`` answers 200 while the main loop turns over, 503 once it has been stuck
for ``STUCK_AFTER`` seconds, and says nothing else: it needs no token. ``/metrics`` needs the
dashboard's token when one is set (``Authorization: Bearer TOKEN``). Both are served, with the
dashboard's page when there is one, by ``jobd.web.endpoint``.

With ``processes`` over 1, each daemon writes its series to files in a directory its
supervisor made (prometheus_client's multiprocess mode, on when ``PROMETHEUS_MULTIPROC_DIR``
is in the daemon's environment at start: ``SHARED``), and the supervisor alone serves them,
merged (``HostMetrics``): counters and histograms summed over every daemon that ran (a restart
loses no count), running handlers and free slots summed over the live ones, the queues' state
(which every daemon reads from Redis) the latest reading of a live one.

Whoever serves also says which jobd it is (``jobd_build_info``, always 1, its labels the
version and Python's) and how its process does (prometheus_client's ``process_*`` series:
``process_start_time_seconds`` changes at each restart). No ``*_created`` series: a counter's
creation time is one more series per counter that dashboards show as a value.
"""

from __future__ import annotations

import math
import platform
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    values,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.multiprocess import MultiProcessCollector

from jobd import __version__
from jobd.outcome import Outcome, Verb
from jobd.store import figures

STUCK_AFTER = 10.0
SHOW_EVERY = 0.5  # seconds between writes of the running and free gauges, when SHARED
# Whether this process's series are written to a directory its supervisor reads (decided by
# prometheus_client when it was imported, from PROMETHEUS_MULTIPROC_DIR).
SHARED: bool = getattr(values.ValueClass, "_multiprocess", False)
DURATION_BUCKETS = figures.BUCKETS  # shared with the per-minute figures in Redis
RSS_BUCKETS = tuple(float(2**n) for n in range(20, 37, 2))  # 1 MiB to 64 GiB, ×4
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60, 300)

disable_created_metrics()  # prometheus_client's switch is process-wide; read at each scrape


class BuildInfo:
    """``jobd_build_info{version, python} 1``: which jobd answers (a collector, not a gauge:
    in multiprocess mode its value would otherwise go through the files)."""

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "jobd_build_info", "The jobd that serves these metrics: always 1.",
            labels=["version", "python"],
        )  # fmt: skip
        family.add_metric([__version__, platform.python_version()], 1)
        yield family


def own_series(registry: CollectorRegistry) -> None:
    """What the serving process says of itself: its build, and its ``process_*`` series."""
    registry.register(BuildInfo())  # type: ignore[arg-type]
    ProcessCollector(registry=registry)


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
    cpu: Any
    rss: Any
    notified: Any  # messages taken from its handlers' channel
    extended: Any  # of which EXTEND_TIMEOUT_USEC, taken while running
    watchdogged: Any  # handlers stopped by their watchdog


class _Void:
    """A series of a queue not in force: what is counted there goes nowhere."""

    def inc(self, amount: float = 1) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass


VOID = QueueMetrics(*(_Void(),) * 12)


def labelled(registry: CollectorRegistry, label: str) -> list[MetricWrapperBase]:
    """Every metric of ``registry`` that has ``label``."""
    with registry._lock:
        collectors = list(registry._collector_to_names)
    return [c for c in collectors if isinstance(c, MetricWrapperBase) and label in c._labelnames]


def remove_where(metric: MetricWrapperBase, label: str, value: str) -> None:
    """Remove every series of ``metric`` whose ``label`` is ``value`` (whatever its others)."""
    at = metric._labelnames.index(label)
    with metric._lock:
        for key in [k for k in metric._metrics if k[at] == value]:
            del metric._metrics[key]


class Metrics:
    """The daemon's series, in a registry of its own, and the main loop's heartbeat."""

    unhealthy = b"main loop stuck\n"  # /healthz's answer when not healthy

    # long: the list of every series, one statement each: split, it would no longer read as one
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        own_series(self.registry)
        self.started = self._counter("jobd_jobs_started", "Handlers started.")
        self.succeeded = self._counter("jobd_jobs_succeeded", "Jobs acknowledged after exit 0.")
        self.retried = self._counter("jobd_jobs_retried", "Failed attempts scheduled again.")
        self.cancelled = self._counter(
            "jobd_jobs_cancelled",
            "Jobs cancelled by jobd cancel, running or not yet.",
        )
        self.dead_lettered = Counter(
            "jobd_jobs_dead_lettered",
            "Jobs dead-lettered, by jobd_error.",
            ["queue", "error"],
            registry=self.registry,
        )
        self.failed = Counter(
            "jobd_jobs_failed",
            "Failed attempts, retried or dead-lettered, by jobd_error (memory: over "
            "resources.memory or OOM-killed).",
            ["queue", "error"],
            registry=self.registry,
        )
        self.reclaimed = self._counter(
            "jobd_jobs_reclaimed", "Entries taken over after their lease lapsed."
        )
        self.leases_lost = self._counter(
            "jobd_leases_lost", "Entries this daemon lost to another consumer."
        )
        self.notify_dropped = Counter(
            "jobd_notify_dropped",
            "Messages on handlers' NOTIFY_SOCKET not taken whole, by reason: stranger (not "
            'from a running job\'s process; queue ""), malformed (taken in part), truncated, '
            'descriptors (taken without the descriptors it brought; queue "").',
            ["queue", "reason"],
            registry=self.registry,
        )
        self.notify_messages = self._counter(
            "jobd_notify_messages",
            "Messages taken from handlers' NOTIFY_SOCKET, each its job's (malformed ones too: "
            "taken in part).",
        )
        self.timeout_extensions = self._counter(
            "jobd_timeout_extensions",
            "EXTEND_TIMEOUT_USEC taken from running handlers: each moved a deadline (up to the "
            "queue's max_timeout).",
        )
        self.watchdog_timeouts = self._counter(
            "jobd_watchdog_timeouts",
            "Handlers stopped by their watchdog (silent past the queue's watchdog after a "
            "WATCHDOG=1); their attempts failed as timeout.",
        )
        self.groups_recreated = self._counter(
            "jobd_groups_recreated",
            "Consumer groups that vanished under a running daemon and were created again at the "
            "stream's start: every entry still in the stream is delivered again.",
        )
        self.trace_context_dropped = Counter(
            "jobd_trace_context_dropped",
            "Trace context fields (traceparent, tracestate, baggage) of started jobs dropped as "
            "not W3C: the job ran without them.",
            ["queue", "field"],
            registry=self.registry,
        )
        self.duration = self._histogram(
            "jobd_handler_duration_seconds", "Handler run time.", DURATION_BUCKETS
        )
        self.latency = self._histogram(
            "jobd_enqueue_to_start_seconds",
            "From the entry's stream id time to handler start.",
            LATENCY_BUCKETS,
        )
        self.cpu = self._histogram(
            "jobd_handler_cpu_seconds",
            "CPU time of each handler (user + system; the leader and what it waited for).",
            DURATION_BUCKETS,
        )
        self.rss = self._histogram(
            "jobd_handler_max_rss_bytes",
            "Largest resident set of each handler (the leader or one it waited for).",
            RSS_BUCKETS,
        )
        # This daemon's own: summed over a supervisor's live daemons.
        self.running = self._gauge("jobd_handlers_running", "Handlers running now.", "livesum")
        self.free = self._gauge("jobd_slots_free", "Free handler slots.", "livesum")
        # The queue's, read from Redis: the same for every daemon, the latest reading counts.
        self.lag = self._gauge("jobd_queue_lag", "Entries not yet delivered to the group.")
        self.pending = self._gauge("jobd_queue_pending", "Entries delivered, not yet settled.")
        self.oldest = self._gauge(
            "jobd_queue_oldest_pending_age_seconds",
            "Age of the oldest pending entry (since it was added), 0 when none.",
        )
        self.delayed = self._gauge("jobd_queue_delayed", "Jobs waiting in the delayed set.")
        self.dead = self._gauge("jobd_queue_dead_lettered", "Records on the dead-letter stream.")
        self.paused = self._gauge(
            "jobd_queue_paused_since_seconds",
            "When the queue was paused (jobd pause), Unix seconds on Redis's clock; 0: running.",
        )
        self.redis_up = Gauge(
            "jobd_redis_up",
            "1 when the last reading of the queues' state reached Redis, 0 when Redis was away.",
            registry=self.registry,
            multiprocess_mode="livemostrecent",
        )
        self.heartbeat = time.monotonic()
        self._queues: dict[str, QueueMetrics] = {}
        # Queues in force (``watch``, ``forget``): only their series are written. A late write
        # for a queue a reload removed (the ticker's report, the recorder's count of a poison
        # dead letter a retired reader decided) would make its series again, for ever; the
        # lock spans look and write (reentrant: ``count`` writes through ``of``).
        self._watched: set[str] = set()
        self._watching = threading.RLock()
        self._shown: dict[tuple[str, str], tuple[Any, Callable[[], float]]] = {}  # SHARED
        self._show_at = 0.0

    def _counter(self, name: str, doc: str) -> Counter:
        return Counter(name, doc, ["queue"], registry=self.registry)

    def _gauge(self, name: str, doc: str, shared: str = "livemostrecent") -> Gauge:
        """``shared``: how a supervisor merges its daemons' values (multiprocess mode)."""
        return Gauge(name, doc, ["queue"], registry=self.registry, multiprocess_mode=shared)  # type: ignore[arg-type]

    def _histogram(self, name: str, doc: str, buckets: Sequence[float]) -> Histogram:
        return Histogram(name, doc, ["queue"], buckets=buckets, registry=self.registry)

    def of(self, queue: str) -> QueueMetrics:
        """The queue's series (created at 0 by ``watch``, so rates work from the first
        scrape); ``VOID`` for a queue not in force."""
        found = self._queues.get(queue)  # forgotten: taken out of the registry, none written
        if found is not None:
            return found
        with self._watching:
            if queue not in self._watched:
                return VOID
            found = self._queues[queue] = QueueMetrics(
                *(m.labels(queue=queue) for m in (self.started, self.succeeded, self.retried,
                                                   self.reclaimed, self.leases_lost,
                                                   self.duration, self.latency, self.cpu,
                                                   self.rss, self.notify_messages,
                                                   self.timeout_extensions,
                                                   self.watchdog_timeouts))
            )  # fmt: skip
            self.cancelled.labels(queue=queue)  # at 0 too, though not touched for every job
            return found

    def queue_state(self, queue: str, report: dict) -> None:
        """The cluster-wide state of a queue, as ``status.queue_status`` read it."""
        with self._watching:
            if queue in self._watched:
                self._queue_state(queue, report)

    def _queue_state(self, queue: str, report: dict) -> None:
        lag = report["lag"]  # None: not known (no group yet), never 0 (nothing waits)
        self.lag.labels(queue=queue).set(math.nan if lag is None else lag)
        self.pending.labels(queue=queue).set(report["pending"])
        age = report["oldest_pending_age"]  # None: none pending
        self.oldest.labels(queue=queue).set(0 if age is None else age)
        self.delayed.labels(queue=queue).set(report["delayed"] or 0)  # None: a key of
        self.dead.labels(queue=queue).set(report["dead_lettered"] or 0)  # another type
        paused = report.get("paused")
        self.paused.labels(queue=queue).set(max(paused["since"], 1) if paused else 0)

    def watch(self, queue: str, running: Callable[[], float], free: Callable[[], float]) -> None:
        """Running handlers and free slots, as the functions say at each scrape; when SHARED,
        written every SHOW_EVERY by the main loop (``beat``): the supervisor reads files."""
        with self._watching:
            self._watched.add(queue)
        self.of(queue)
        for gauge, value in ((self.running, running), (self.free, free)):
            if SHARED:
                self._shown[gauge._name, queue] = (gauge.labels(queue=queue), value)
            else:
                gauge.labels(queue=queue).set_function(value)

    def count(self, outcome: Outcome) -> None:
        """An outcome decided (by the loop's policy, or a reader for poison: the recorder
        counts it once written, maybe after a reload removed its queue: then not at all)."""
        with self._watching:
            if outcome.queue.name in self._watched:
                self._count(outcome)

    def _count(self, outcome: Outcome) -> None:
        ran = outcome.ran
        if ran is not None and ran.cpu_seconds is not None:
            series = self.of(outcome.queue.name)
            series.cpu.observe(ran.cpu_seconds)
            if ran.max_rss_bytes is not None:  # known only above the daemon's own (see handler)
                series.rss.observe(ran.max_rss_bytes)
        if outcome.verb is Verb.ACK:
            self.of(outcome.queue.name).succeeded.inc()
        elif outcome.verb is Verb.RETRY:
            self.of(outcome.queue.name).retried.inc()
            self._failed(outcome.queue.name, outcome.error)
        elif outcome.verb is Verb.DEAD_LETTER:
            self._failed(outcome.queue.name, outcome.error)
            self.dead_lettered.labels(queue=outcome.queue.name, error=outcome.error).inc()
        elif outcome.verb is Verb.CANCEL:
            self.cancelled.labels(queue=outcome.queue.name).inc()

    def trace_dropped(self, queue: str, fields: Sequence[str]) -> None:
        for name in fields:
            self.add(self.trace_context_dropped, queue, field=name)

    def add(self, counter: Counter, queue: str, amount: float = 1, **labels: str) -> None:
        """``amount`` more on ``counter`` for a queue in force, or "" (of no queue, as a
        stranger's message): nothing for a queue a reload removed (see ``_watched``)."""
        with self._watching:
            if queue == "" or queue in self._watched:
                counter.labels(queue=queue, **labels).inc(amount)

    def _failed(self, queue: str, error: str | None) -> None:
        self.failed.labels(queue=queue, error=error).inc()

    def forget(self, queue: str) -> None:
        """Drop every series of a queue a reload removed, once nothing of it runs: kept, each
        renamed queue left its series (histograms and all, and its gauges' functions holding
        its slots) for ever, and /metrics listed every name ever served. In multiprocess mode
        (``SHARED``) the files keep what was written (prometheus_client cannot remove there);
        this process still forgets its own. Every metric with a ``queue`` label is looked
        at (a list of them missed the ones added later), and every label set of the queue
        removed; nothing writes one again (``_watched``)."""
        with self._watching:
            self._watched.discard(queue)
            self._queues.pop(queue, None)
        for shown in [k for k in self._shown if k[1] == queue]:
            del self._shown[shown]
        if SHARED:
            return
        for metric in labelled(self.registry, "queue"):
            remove_where(metric, "queue", queue)

    def beat(self) -> None:
        """The main loop turned over."""
        self.heartbeat = now = time.monotonic()
        if self._shown and now >= self._show_at:
            self._show_at = now + SHOW_EVERY
            for gauge, value in self._shown.values():
                gauge.set(value())

    def healthy(self) -> bool:
        return time.monotonic() - self.heartbeat < STUCK_AFTER


class HostMetrics:
    """The series of a supervisor's daemons, merged from the files they write in
    ``directory`` at each scrape (see the module's docstring), and the supervisor's own:
    restarts. Healthy when ``healthy`` says so (every daemon running and ready)."""

    unhealthy = b"not every daemon process is running and ready\n"

    def __init__(self, directory: str, healthy: Callable[[], bool]) -> None:
        self.registry = CollectorRegistry()
        own_series(self.registry)
        MultiProcessCollector(self.registry, path=directory)
        self.restarts = Counter(
            "jobd_process_restarts",
            "Daemon processes the supervisor started again after they died.",
            ["process"],
            registry=self.registry,
        )
        self._healthy = healthy

    def healthy(self) -> bool:
        return self._healthy()
