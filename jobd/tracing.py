"""jobd's own spans, with the optional ``otel`` extra: off unless the config's ``tracing`` turns
them on (``tracing.enabled``, or an ``otlp_endpoint``), and then only for jobs that carry a
producer's trace context (``jobd.trace``).

For such a job, each attempt makes two spans, children of the producer's span: ``wait QUEUE``,
from the entry's enqueue time (its stream id) to the handler's start, and ``process QUEUE``,
from the start to the outcome (attributes: ``jobd.queue``, ``jobd.job_id``, ``jobd.attempt``,
``jobd.outcome``, and OpenTelemetry's ``messaging.*`` names); the handler's TRACEPARENT then
names the attempt's span, so the handler's own spans are its children. They are exported over
OTLP/HTTP by a batch processor (its thread, its queue: the loop never waits for the collector),
and the last ones are flushed when the daemon stops.

OpenTelemetry is imported only by ``setup`` with tracing on: a daemon without it, or without
the extra installed, never imports it; a job without a trace context pays one attribute check
(``Handler.spawn``). Should the SDK fail (not installed, a bad endpoint), jobd says so once and
runs on without its spans: the handler still gets the producer's context.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from jobd.config import QueueConfig, TracingConfig
from jobd.logs import word

if TYPE_CHECKING:
    from jobd.job import Job
    from jobd.outcome import Outcome

log = logging.getLogger("jobd.tracing")

_spans: Spans | None = None  # set by ``setup`` when tracing is on


class Spans:
    """An OpenTelemetry tracer exporting over OTLP/HTTP (imports the SDK)."""

    def __init__(self, config: TracingConfig) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        from jobd import __version__

        self.provider = TracerProvider(resource=Resource.create({"service.name": config.service}))
        endpoint = config.otlp_endpoint
        exporter = OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("jobd", __version__)
        self.propagator = TraceContextTextMapPropagator()
        self.kinds = SpanKind
        self.error = Status(StatusCode.ERROR)

    def start(self, job: Job, queue: QueueConfig) -> tuple[Any, str]:
        """The queue wait's span (ended now) and the attempt's (started now), and the
        traceparent that names the attempt's span."""
        trace = job.trace
        assert trace is not None and trace.traceparent is not None
        carrier = {"traceparent": trace.traceparent}
        if trace.tracestate is not None:
            carrier["tracestate"] = trace.tracestate
        parent = self.propagator.extract(carrier)
        now = time.time_ns()
        # A job id is any bytes (surrogateescape): an attribute must be UTF-8, or the exporter's
        # thread fails on the whole batch. As the logs show it (logs.word: \xff for a byte).
        job_id = word(job.job_id)
        attributes = {
            "messaging.system": "jobd",
            "messaging.destination.name": queue.name,
            "messaging.message.id": job_id,
            "jobd.queue": queue.name,
            "jobd.job_id": job_id,
            "jobd.attempt": job.attempt,
        }
        enqueued = min(now, int(job.enqueued_at() * 1e9))
        wait = self.tracer.start_span(f"wait {queue.name}", parent, self.kinds.INTERNAL,
                                      attributes, start_time=enqueued)  # fmt: skip
        wait.end(end_time=now)
        span = self.tracer.start_span(f"process {queue.name}", parent, self.kinds.CONSUMER,
                                      attributes, start_time=now)  # fmt: skip
        context = span.get_span_context()
        flags = int(context.trace_flags)
        return span, f"00-{context.trace_id:032x}-{context.span_id:016x}-{flags:02x}"

    def end(self, span: Any, outcome: Outcome, end_time: int | None = None) -> None:
        from jobd.outcome import Verb

        span.set_attribute("jobd.outcome", said(outcome))
        if outcome.error:
            span.set_attribute("jobd.error", outcome.error)
        if outcome.verb is not Verb.ACK:
            span.set_status(self.error)
        span.end(end_time=end_time)

    def shutdown(self) -> None:
        self.provider.shutdown()  # exports what is left, within the exporter's timeout


def said(outcome: Outcome) -> str:
    """An attempt's ``jobd.outcome``: the event its note writes (``notes.event_of``: ``done``,
    ``retried``…); a release, which writes none (the entry is someone else's to settle),
    ``released``, as the journal's JOBD_OUTCOME says it."""
    from jobd.outcome import JOURNAL_OUTCOME, Verb
    from jobd.store.notes import event_of

    return JOURNAL_OUTCOME[Verb.RELEASE] if outcome.verb is Verb.RELEASE else event_of(outcome)


def setup(config: TracingConfig | None) -> None:
    """Turn jobd's spans on when ``config`` says so (once per process, at the daemon's
    start); a failure is said once and leaves them off."""
    global _spans
    if config is None or not config.enabled or _spans is not None:
        return
    try:
        _spans = Spans(config)
    except Exception as exc:  # ImportError above all: the otel extra is not installed
        log.error("tracing is configured but cannot start (%s: %s); running without jobd's "
                  "spans (install jobd[otel])", type(exc).__name__, exc)  # fmt: skip
        return
    log.info("tracing on: spans exported over OTLP/HTTP to %s",
             config.otlp_endpoint or "the OTEL_EXPORTER_OTLP_* endpoint")  # fmt: skip


def attempt(job: Job, queue: QueueConfig, env: dict[str, str]) -> Any:
    """A traced job is starting: its trace variables into the handler's ``env``; with tracing
    on, the spans of its wait and of this attempt (returned, to end with its outcome), the
    handler's TRACEPARENT naming the attempt's span."""
    trace = job.trace
    assert trace is not None
    if _spans is None or trace.traceparent is None:
        env.update(trace.environment())
        return None
    try:
        span, traceparent = _spans.start(job, queue)
    except Exception:  # the daemon never fails a job for its spans
        log.exception("%s cannot start its span", job.tag(queue.name))
        env.update(trace.environment())
        return None
    env.update(trace.environment(traceparent))
    return span


def ended(span: Any, outcome: Outcome, exited: float | None = None) -> None:
    """The attempt whose span this is ended with ``outcome``; the span ends when its handler's
    exit was seen (``exited``, monotonic seconds), not when it left the table (up to the
    channel's LEAVE_WAIT later) nor when its follow-ups were parsed; None: now."""
    if _spans is None or span is None:
        return
    try:
        _spans.end(span, outcome, wall_ns(exited))
    except Exception:
        log.exception("cannot end a span")


def wall_ns(moment: float | None) -> int | None:
    """A monotonic ``moment`` as an OpenTelemetry time (wall-clock nanoseconds); None: None."""
    if moment is None:
        return None
    return time.time_ns() - max(0, int((time.monotonic() - moment) * 1e9))


def shutdown() -> None:
    """The daemon stops: export the spans not sent yet."""
    global _spans
    if _spans is not None:
        spans, _spans = _spans, None
        try:
            spans.shutdown()
        except Exception:
            log.exception("cannot export the last spans")
