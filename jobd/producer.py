"""Adding jobs: what `jobd enqueue` does, usable from Python too."""

from __future__ import annotations

import time
import uuid

import redis

from jobd import delayed, redisconn
from jobd.config import Config
from jobd.job import JOB_ID, PAYLOAD
from jobd.scripts import Scripts


class ProducerError(Exception):
    pass


def enqueue(
    config: Config,
    queue: str,
    payload: bytes,
    job_id: str | None = None,
    at: float | None = None,
    client: redis.Redis | None = None,
) -> str:
    """Add one job to ``queue``; returns its job id.

    Now: XADD to the stream, and the job id is the ``job_id`` given, else the stream id.
    With ``at`` (Unix seconds) in the future: into the queue's delayed set, moved to the stream
    when due; a job id is generated when none is given, since there is no stream id yet.
    """
    q = config.queues[queue]
    fields: dict[bytes, bytes] = {PAYLOAD: payload}
    later = at is not None and at > time.time()
    if later and job_id is None:
        job_id = uuid.uuid4().hex
    if job_id is not None:
        fields[JOB_ID] = job_id.encode()
    own = client is None
    client = client or redisconn.client(config.redis, "jobd-enqueue")
    try:
        if later:
            delayed.schedule(Scripts(client), q, fields, int(at * 1000))  # type: ignore[operator]
            return job_id  # type: ignore[return-value]
        message_id = client.xadd(q.stream, fields)  # type: ignore[arg-type]
    except redisconn.UNAVAILABLE as exc:
        raise ProducerError(f"cannot reach Redis at {config.redis.describe()}: {exc}") from exc
    except redis.ResponseError as exc:
        raise ProducerError(f"Redis refused the job: {exc}") from exc
    finally:
        if own:
            client.close()
    return job_id if job_id is not None else message_id.decode()
