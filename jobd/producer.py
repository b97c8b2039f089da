"""Adding jobs: what `jobd enqueue` does, usable from Python too."""

from __future__ import annotations

import redis

from jobd import redisconn
from jobd.config import Config
from jobd.job import JOB_ID, PAYLOAD


class ProducerError(Exception):
    pass


def enqueue(
    config: Config,
    queue: str,
    payload: bytes,
    job_id: str | None = None,
    client: redis.Redis | None = None,
) -> str:
    """XADD one job to ``queue``'s stream; returns its job id (the stream id when none given)."""
    q = config.queues[queue]
    fields: dict[bytes, bytes] = {PAYLOAD: payload}
    if job_id is not None:
        fields[JOB_ID] = job_id.encode()
    own = client is None
    client = client or redisconn.client(config.redis, "jobd-enqueue")
    try:
        message_id = client.xadd(q.stream, fields)  # type: ignore[arg-type]
    except redisconn.UNAVAILABLE as exc:
        raise ProducerError(f"cannot reach Redis at {config.redis.redacted_url()}: {exc}") from exc
    except redis.ResponseError as exc:
        raise ProducerError(f"Redis refused the job: {exc}") from exc
    finally:
        if own:
            client.close()
    return job_id if job_id is not None else message_id.decode()
