"""A queue's ``then:`` steps at a handler's end (docs: Workflows; the config's side is
``config.chains``): the follow-ups each done job enqueues, made like those of its JOBD_ENQUEUE
file (``process.followups``) and written with them, with its acknowledgement, in one step.

Nothing of this runs for a queue without ``then:``: its handlers' stdout is an ``Output`` as
ever, and ``policy.of_handler`` asks ``queue.then`` once. A queue with a ``payload: stdout``
step keeps its handlers' whole stdout (``Captured``), up to its ``result_max``: more fails the
attempt (dead-lettered at once, ``enqueue``), as a payload above the target queue's
``max_payload`` does: a step is never enqueued with a payload cut short.

A step's follow-up has the job id ``PARENT_ID.then.N`` (N: the step's place in ``then:``, from
1), the field ``jobd_parent``, the parent's trace context, and its mark named after the
parent's enqueue and ``then.N`` (never a number of the file's).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from jobd.config import QueueConfig
from jobd.config.types import ChainStep
from jobd.job import PARENT, PAYLOAD, Job
from jobd.newjob import JobClock, follow_up_id, follow_up_template, prepare
from jobd.outcome import FollowUp, weight
from jobd.process.channel import ProgressOutput
from jobd.process.output import Output


class _Captures:
    """Mixed in before an output class: the whole stream kept too (``whole``), up to the
    queue's ``result_max``; None once it wrote more."""

    whole: bytearray | None
    limit: int

    def feed(self, data: bytes) -> None:
        if self.whole is not None:
            self.whole += data
            if len(self.whole) > self.limit:
                self.whole = None
        super().feed(data)  # type: ignore[misc]


class CapturedOutput(_Captures, Output):
    pass


class CapturedProgress(_Captures, ProgressOutput):
    pass


def output_class(queue: QueueConfig, plain: type[Output]) -> Any:
    """The class of a handler's stdout (``plain`` without capture): captured when a ``then:``
    step sends it on; a factory taking (handler, name, keep) as an Output does."""
    if not any(step.payload == "stdout" for step in queue.then):
        return plain
    kind = CapturedProgress if plain is ProgressOutput else CapturedOutput

    def make(handler: Any, name: str, keep: int) -> Output:
        out = kind(handler, name, keep)
        out.whole, out.limit = bytearray(), queue.result_max
        return out

    return make


def targets(
    started: Mapping[str, QueueConfig] | None, queues: Mapping[str, QueueConfig]
) -> Mapping[str, QueueConfig]:
    """Where a handler's follow-ups go, its ``then:`` steps' and its JOBD_ENQUEUE file's: each
    queue as the config in force (``queues``) defines it, its stream and its limits (a follow-up
    its queue would dead-letter unrun is refused now, whatever the config at the handler's
    start said: review 35ab); a queue a reload removed since as the config the handler started
    under (``started``; None: not known) did: a running handler finishes under the steps it
    started with, so a step whose queue a reload removed (with the step) is still added to that
    queue's stream, where it waits until a config serves the queue."""
    if started is None or started is queues:
        return queues
    return {**started, **queues}


def then_follow_ups(
    job: Job, queue: QueueConfig, queues: Mapping[str, QueueConfig], result: bytes | None,
    stdout: Output,
) -> tuple[tuple[FollowUp, ...], str | None]:  # fmt: skip
    """The follow-ups of ``queue``'s ``then:`` for ``job``, done with ``result`` and
    ``stdout``, to their queues as ``queues`` (``targets``) defines them; or why they fail the
    attempt."""
    made: list[FollowUp] = []
    for n, step in enumerate(queue.then, 1):
        target = queues.get(step.queue)
        if target is None:  # the config checked it (``targets`` keeps it after a reload)
            return (), f"then: queue {step.queue!r} is not in the config"
        payload = _payload(step, job, result, stdout, queue)
        if isinstance(payload, str):
            return (), f"then: {step.queue}: {payload}"
        if len(payload) > target.max_payload:
            return (), (
                f"then: {step.queue}: payload of {len(payload)} bytes is above queue "
                f"{step.queue!r}'s max_payload ({target.max_payload})"
            )
        made.append(_follow_up(job, queue, target, step, n, payload))
    return tuple(made), None


def _payload(
    step: ChainStep, job: Job, result: bytes | None, stdout: Output, queue: QueueConfig
) -> bytes | str:
    """The payload ``step`` sends on, or why there is none."""
    if step.payload == "payload":
        return job.fields.get(PAYLOAD, b"")
    if step.payload == "result":
        return result or b""
    whole = getattr(stdout, "whole", None)
    if whole is None:
        return f"stdout of more than result_max ({queue.result_max} bytes) for payload: stdout"
    return bytes(whole)


def _follow_up(
    job: Job, queue: QueueConfig, target: QueueConfig, step: ChainStep, n: int, payload: bytes
) -> FollowUp:
    job_id = follow_up_id(job.job_id, f"then.{n}")
    template = follow_up_template(job)
    entry, _ = prepare(replace(template, payload=payload, job_id=job_id, delay=step.delay),
                       JobClock(job))  # fmt: skip
    entry.fields[PARENT] = f"{queue.name} ".encode() + os.fsencode(job.job_id)
    mark = target.keys.follow_up(queue.name, job.job_id, job.origin, f"then.{n}")
    fields = entry.fields
    return FollowUp(target, fields, entry.due, os.fsencode(job_id), mark, weight(fields))
