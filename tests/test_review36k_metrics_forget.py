"""Review 36k of issue 36: a queue a reload removed keeps series in /metrics after
``Metrics.forget``, and a late poison count makes some again.

``Metrics.forget`` says it drops "every series of a queue a reload removed" (kept, "each renamed
queue left its series ... and /metrics listed every name ever served"), and ``queue_state``
checks the queues in force (``_watched``) under a lock so that a late status report cannot make
a removed queue's gauges again. But:

1. ``forget`` removes the series of the ``by_queue`` metrics and ``jobd_jobs_failed`` /
   ``jobd_jobs_dead_lettered`` (by the errors seen), never ``jobd_notify_dropped{queue, reason}``
   (``daemon/channel.py Channel.drop``: malformed and truncated messages carry the handler's
   queue) nor ``jobd_trace_context_dropped{queue, field}`` (``Metrics.trace_dropped``, from
   ``daemon/admission.py`` at each start). A queue whose handlers ever sent one malformed
   NOTIFY_SOCKET message, or whose jobs carried a bad traceparent, is listed for ever after it
   was removed or renamed (jobd/web/metrics.py ``forget``: the two metrics are in neither list).
2. ``count`` (and ``of``, ``_failed``) writes a queue's series whatever ``_watched`` says. The
   recorder counts a poison dead letter once it is written (``daemon/recorder.py
   _poison_written`` -> ``Metrics.count``), on its own thread, after the reader that decided
   it handed it over: a reader retired by a reload ends, ``Queues.gone`` finds nothing
   ``busy`` (the recorder's pending writes are not looked at: loop.py ``hand_over``) and
   ``forget`` runs; the recorder's write (held while Redis is slow or away, it retries) then
   counts it and ``jobd_jobs_failed{queue=old,error=poison}`` and
   ``jobd_jobs_dead_lettered{...}`` are made again, for ever (``_errors`` remembers the queue
   again too, so only a later forget of that name would drop them).

What should happen: after ``forget(q)`` no series labelled ``queue=q`` is exported, and none is
made again by a late count; the suggested fix: ``forget`` removes every label set of
``notify_dropped`` and ``trace_context_dropped`` whose queue is ``q`` (``metric._metrics``
keys, under the metric's lock), and ``count``/``of``/``trace_dropped``/the channel's drop check
``_watched`` under ``_watching`` as ``queue_state`` does (a count for a queue not in force is
dropped).
"""

from __future__ import annotations

from types import SimpleNamespace

from jobd.outcome import POISON, Verb
from jobd.web.metrics import Metrics


def series_of(metrics: Metrics, queue: str) -> list[str]:
    """The exported samples labelled ``queue``."""
    return sorted(
        f"{s.name}{sorted(s.labels.items())}"
        for family in metrics.registry.collect()
        for s in family.samples
        if s.labels.get("queue") == queue
    )


def test_forget_drops_notify_dropped_and_trace_context_series() -> None:
    m = Metrics()
    m.watch("old", running=lambda: 0.0, free=lambda: 1.0)
    m.of("old")
    m.add(m.notify_dropped, "old", reason="malformed")  # Channel.drop
    m.trace_dropped("old", ["traceparent"])  # Admission at a start
    m.forget("old")
    left = series_of(m, "old")
    assert left == [], f"series of a forgotten queue still exported: {left}"


def test_poison_counted_after_forget_makes_no_series_again() -> None:
    m = Metrics()
    m.watch("old", running=lambda: 0.0, free=lambda: 1.0)
    m.of("old")
    m.forget("old")  # the reload removed it; its reader ended, nothing busy
    assert series_of(m, "old") == []
    # The recorder writes the poison dead letter the retired reader decided, then counts it.
    outcome = SimpleNamespace(ran=None, verb=Verb.DEAD_LETTER, queue=SimpleNamespace(name="old"),
                              error=POISON)  # fmt: skip
    m.count(outcome)  # type: ignore[arg-type]
    made = series_of(m, "old")
    assert made == [], f"a count after forget made the removed queue's series again: {made}"


def test_forget_drops_a_series_of_every_metric_with_a_queue_label() -> None:
    """Whatever metric is added later: each one with a ``queue`` label is emptied of the queue."""
    m = Metrics()
    m.watch("old", running=lambda: 0.0, free=lambda: 1.0)
    m.watch("kept", running=lambda: 0.0, free=lambda: 1.0)
    for family in list(m.registry._collector_to_names):
        names = getattr(family, "_labelnames", ())
        if "queue" in names:
            for queue in ("old", "kept"):
                family.labels(**{n: queue if n == "queue" else "x" for n in names})
    m.forget("old")
    assert series_of(m, "old") == []
    assert series_of(m, "kept"), "a queue in force keeps its series"
    m.trace_dropped("old", ["traceparent"])
    m.add(m.notify_dropped, "old", reason="malformed")
    m.add(m.groups_recreated, "old")
    m.add(m.notify_dropped, "", reason="stranger")  # of no job: counted whatever is in force
    assert series_of(m, "old") == []
    assert series_of(m, "") != []
