"""A job as delivered from the stream: its ids, its attempt, and the bytes for stdin."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import orjson

from jobd.store.keys import QueueKeys

log = logging.getLogger("jobd.job")

PAYLOAD = b"payload"
JOB_ID = b"job_id"
RESERVED_JOB_ID = b"jobd_job_id"  # set by jobd when it re-adds a job (retries)
RESERVED_ATTEMPT = b"jobd_attempt"
UNIQUE = b"jobd_unique"  # set by `jobd enqueue --unique`: the job holds its job id's mark
# The most fields (name, value pairs) an entry may have to be run. A Lua script can pass at most
# ~8000 values to one command (Lua's unpack limit, see REDIS-NOTES), so the scripts that copy an
# entry (retry, promote, dead letter, requeue) could not copy a wider one: such an entry is
# dead-lettered unrun as `malformed`. The scripts that copy fields name the same number.
MAX_FIELDS = 1000
KEPT = (RESERVED_JOB_ID, RESERVED_ATTEMPT, UNIQUE)  # jobd's fields that a retry carries


@dataclass(frozen=True, slots=True)
class Job:
    queue: str
    message_id: str  # this delivery's stream id
    fields: dict[bytes, bytes]
    # Stable across retries and redeliveries. Any bytes a producer wrote, decoded with
    # surrogateescape (os.fsdecode): os.fsencode gives the exact bytes back, for Redis and exec.
    job_id: str
    attempt: int  # 1 for the first attempt

    @classmethod
    def from_entry(cls, queue: str, message_id: bytes, fields: dict[bytes, bytes]) -> Job:
        mid = message_id.decode("ascii")
        return cls(queue, mid, fields, _job_id(queue, mid, fields), _attempt(queue, mid, fields))

    def tag(self, queue: str) -> str:
        """How log lines name this job."""
        # One word, so JSON logs parse it; the formatters escape control characters.
        job = self.job_id.replace(" ", "\\x20")
        return f"queue={queue} job={job} attempt={self.attempt}"

    def enqueued_at(self) -> float:
        """Unix time of this entry's stream id: when it was added (or re-added for a retry)."""
        return int(self.message_id.split("-", 1)[0]) / 1000

    def payload_size(self) -> int:
        payload = self.fields.get(PAYLOAD)
        return len(payload) if payload is not None else len(self.stdin_bytes())

    def next_attempt_fields(self) -> dict[bytes, bytes]:
        """The fields of this job's next attempt: its own, with jobd's bookkeeping renewed."""
        fields = {k: v for k, v in self.fields.items() if not k.startswith(b"jobd_")}
        fields[RESERVED_JOB_ID] = os.fsencode(self.job_id)
        fields[RESERVED_ATTEMPT] = str(self.attempt + 1).encode()
        if UNIQUE in self.fields:
            fields[UNIQUE] = self.fields[UNIQUE]
        return fields

    def too_wide(self) -> int | None:
        """The width of this job's next attempt (its own fields and jobd's), when that is more
        than MAX_FIELDS: a script could not copy it for a retry."""
        if len(self.fields) <= MAX_FIELDS - len(KEPT):  # nearly every job: nothing to count
            return None
        width = len(self.next_attempt_fields())
        return width if width > MAX_FIELDS else None

    def mark_key(self, keys: QueueKeys, dedupe: bool) -> bytes | None:
        """The key of this job's mark when it has one to keep: a producer's job id on a queue
        with a dedupe window, or a job enqueued with --unique."""
        if UNIQUE in self.fields or (dedupe and JOB_ID in self.fields):
            return keys.job_mark(self.job_id)
        return None

    def stdin_bytes(self) -> bytes:
        """The ``payload`` field byte for byte; else a JSON object of the entry's fields."""
        payload = self.fields.get(PAYLOAD)
        if payload is not None:
            return payload
        return orjson.dumps(
            {
                k.decode("utf-8", "replace"): v.decode("utf-8", "replace")
                for k, v in self.fields.items()
            }
        )


def _job_id(queue: str, message_id: str, fields: dict[bytes, bytes]) -> str:
    for name in (JOB_ID, RESERVED_JOB_ID):
        raw = fields.get(name)
        if raw is None:
            continue
        if raw and b"\0" not in raw:
            # Environment values are bytes to the kernel: surrogateescape keeps them exact.
            return os.fsdecode(raw)
        log.warning(
            "queue=%s message=%s: field %s is empty or holds a NUL byte; using the stream id",
            queue,
            message_id,
            name.decode(),
        )
    return message_id


def _attempt(queue: str, message_id: str, fields: dict[bytes, bytes]) -> int:
    raw = fields.get(RESERVED_ATTEMPT)
    if raw is None:
        return 1
    try:
        attempt = int(raw)
    except ValueError:
        attempt = 0
    if attempt < 1:
        log.warning("queue=%s message=%s: bad jobd_attempt %r; using 1", queue, message_id, raw)
        return 1
    return attempt
