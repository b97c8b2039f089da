"""An attempt's own variables, on top of its queue's environment (``process.environment``):
who it is, its deadline, its channel, its result's path, its trace."""

from __future__ import annotations

import time

from jobd import tracing
from jobd.config import QueueConfig
from jobd.job import Job
from jobd.process import results


def job_variables(
    job: Job, queue: QueueConfig, payload_bytes: int, notify: str | None = None
) -> dict[str, str]:
    """The job's own variables, on top of its queue's environment; ``notify``: the address of
    the daemon's channel (``daemon.channel``), for NOTIFY_SOCKET."""
    variables = dict(
        JOBD_QUEUE=queue.name,
        JOBD_STREAM=queue.stream,
        JOBD_JOB_ID=job.job_id,
        JOBD_MESSAGE_ID=job.message_id,
        JOBD_ATTEMPT=str(job.attempt),
        # Unix time: its start plus its timeout (the job's own, if less); an extension of its
        # deadline (EXTEND_TIMEOUT_USEC) does not change it (docs/handlers-talking-back.md).
        JOBD_DEADLINE=str(int(time.time() + job.timeout(queue))),
        # A handler whose daemon dies while the payload is still being written reads a short
        # stdin then EOF; this tells it so (extension of the contract, see docs/handlers.md).
        JOBD_PAYLOAD_BYTES=str(payload_bytes),
    )
    if notify is not None:  # as systemd's; with a watchdog, WATCHDOG=1 is due at half of it
        variables["NOTIFY_SOCKET"] = notify
        if queue.watchdog is not None:
            variables["WATCHDOG_USEC"] = str(int(queue.watchdog * 1e6))
    return variables


def attempt_environment(
    job: Job, queue: QueueConfig, payload_bytes: int, notify: str | None = None
) -> tuple[dict[str, str], object | None, str]:
    """An attempt's own variables (``job_variables``); jobd's span of the attempt, when the job
    is traced (its TRACEPARENT then names it: ``jobd.tracing``); the path JOBD_RESULT names
    (``process.results``; JOBD_ENQUEUE is the same plus ``.enqueue``: ``process.followups``)."""
    job_env = job_variables(job, queue, payload_bytes, notify)
    span = None if job.trace is None else tracing.attempt(job, queue, job_env)
    job_env["JOBD_RESULT"] = result_path = results.FOLDERS.name(bool(queue.run_as_user))
    job_env["JOBD_ENQUEUE"] = result_path + ".enqueue"  # process.followups: its follow-ups
    return job_env, span, result_path
