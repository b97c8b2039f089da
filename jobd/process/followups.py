"""A handler's follow-up jobs: the file ``JOBD_ENQUEUE`` names, read once its attempt is done.

Like its result (``process.results``), nothing is made for a job: ``JOBD_ENQUEUE`` is its
``JOBD_RESULT`` path plus ``.enqueue``, in the same folder, as secret; a handler that writes
no follow-up costs one failed ``open`` at its end. Each line is a job in the ``--ndjson``
format (``jobd.ndjson``) plus ``"queue"``, a queue of the config; blank lines are skipped. The
file is removed at the job's end, whatever the outcome, and read only when the attempt
succeeded: its jobs are then written with the job's acknowledgement, in the same step
(``store.outcomes``; on a Redis Cluster through the queue's outbox, ``store.outbox``).

A file jobd will not take fails the attempt, which is dead-lettered at once (``enqueue``),
and none of its jobs is enqueued: more than ``max_follow_ups`` jobs, more than ``MAX_BYTES``,
jobs that hold more than ``max_follow_ups_bytes`` together (``outcome.weight``), a line that is
no job (its number and why), a job wider than jobd runs one (``job.MAX_FIELDS``, jobd's fields
counted as the daemon that reads it counts them: as ``jobd.producer`` refuses one), a queue
not in the config, a payload above the queue's ``max_payload``, or ``unique`` (a follow-up is
once by construction). The why quotes the handler's text in part only (``WHY_MOST``): it ends
the dead letter's ``jobd_stderr``, whose last 4 KiB are kept, and leaves the handler's own
stderr room.

Those bounds are what keeps the one Redis call that writes a job's follow-ups with its
acknowledgement short (``settle.lua``; it blocks every other client of that Redis meanwhile):
a job wider than ``MAX_FIELDS`` would make it fail half-way, having written the follow-ups
before it, and the Redis time grows with the jobs, their fields and their bytes (measured:
docs/workflows.md, bench/follow_ups_cost.py).

Each follow-up gets a job id derived from its parent's and its place in the file (``ID.N``, N
from 1), unless its line gives one, and the field ``jobd_parent`` ("QUEUE JOB_ID"). Its
``mark`` (``store.keys.QueueKeys.follow_up``) names the parent's enqueue (queue, job id,
origin) and N: what makes moving it out of an outbox idempotent.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import orjson

from jobd import ndjson
from jobd.config import QueueConfig
from jobd.job import PARENT, Job
from jobd.newjob import JobClock, follow_up_id, follow_up_template, prepare, too_wide
from jobd.outcome import FIELD_BYTES, FollowUp, weight
from jobd.process import results

SUFFIX = ".enqueue"  # JOBD_ENQUEUE is JOBD_RESULT's path plus this
PACE = 64  # lines parsed between two calls of ``parse``'s ``pause``
MAX_BYTES = 64 * 2**20  # the most a JOBD_ENQUEUE file may hold (read whole into the daemon)
# A refusal's why longer than this many characters keeps its first WHY_HEAD and its last WHY_TAIL
# (a handler's value quoted whole, a 1 MiB queue name, would push the rest out of jobd_stderr).
WHY_MOST, WHY_HEAD, WHY_TAIL = 480, 240, 120


class FollowUpError(Exception):
    """The file names jobs jobd will not take: the attempt fails with this reason."""


def path_of(result_path: str) -> str:
    return result_path + SUFFIX


def collected(
    result_path: str | None, job: Job, queue: QueueConfig, queues: Mapping[str, QueueConfig],
    ok: bool, uid: int, pause: Callable[[], object] | None = None,
) -> tuple[tuple[FollowUp, ...], str | None]:  # fmt: skip
    """The follow-ups of a handler at its end (none unless its attempt succeeded: ``ok``), its
    file removed either way; or why they fail the attempt. ``uid``: the handler's, as spawned
    (``results.take``); ``pause``: ``parse``'s."""
    if result_path is None:
        return (), None
    try:
        data = results.take(path_of(result_path), uid, MAX_BYTES, ok, "JOBD_ENQUEUE")
        if not data:
            return (), None
        return parse(data, job, queue, queues, pause), None
    except (results.ResultError, FollowUpError) as exc:
        return (), str(exc)


def parse(
    data: bytes, job: Job, queue: QueueConfig, queues: Mapping[str, QueueConfig],
    pause: Callable[[], object] | None = None,
) -> tuple[FollowUp, ...]:  # fmt: skip
    """The follow-ups ``data`` (a JOBD_ENQUEUE file) names; FollowUpError for the first line
    that is no job or a job wider than ``MAX_FIELDS``, for more than the queue's
    ``max_follow_ups``, or for jobs that weigh more than its ``max_follow_ups_bytes``. ``pause``
    is called every PACE lines (a thread parsing beside the daemon's loop lets it have the GIL
    meanwhile)."""
    start = ndjson.as_arguments(follow_up_template(job))  # once: the same for every line
    parent = f"{queue.name} ".encode() + os.fsencode(job.job_id)  # each one's PARENT field
    clock, most, budget = JobClock(job), queue.max_follow_ups, queue.max_follow_ups_bytes
    found: list[FollowUp] = []
    held = 0  # what the jobs found weigh together
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip(b" \t\r"):
            continue
        if pause is not None and not number % PACE:
            pause()
        if len(found) >= most:
            raise FollowUpError(f"JOBD_ENQUEUE: more than max_follow_ups ({most}) jobs")
        try:
            new = _follow_up(line, len(found) + 1, job, queue, queues, start, clock, parent)
        except ValueError as exc:
            raise FollowUpError(brief(f"JOBD_ENQUEUE line {number}: {exc}")) from None
        held += new.weight
        if held > budget:
            raise FollowUpError(
                f"JOBD_ENQUEUE: its jobs up to line {number} hold more than max_follow_ups_bytes "
                f"({budget}), each field counted as {FIELD_BYTES} bytes at least"
            )
        found.append(new)
    return tuple(found)


def brief(why: str) -> str:
    """``why``, its middle cut when it is longer than ``WHY_MOST`` characters (saying how many
    were cut): a refusal's why says its line and its reason whatever the handler wrote."""
    if len(why) <= WHY_MOST:
        return why
    return f"{why[:WHY_HEAD]}…[{len(why) - WHY_HEAD - WHY_TAIL} characters]…{why[-WHY_TAIL:]}"


def _follow_up(
    line: bytes, n: int, parent: Job, queue: QueueConfig, queues: Mapping[str, QueueConfig],
    template: dict[str, object], clock: JobClock, parent_field: bytes,
) -> FollowUp:  # fmt: skip
    """The follow-up of one line, the ``n``th job of the file, its ``PARENT`` field
    ``parent_field``; ValueError saying why not, a job wider than jobd runs one too (jobd's
    fields counted: ``newjob.too_wide``). The line is parsed once (``orjson``), its job made
    from the object (``ndjson.job_from_object``)."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    name = obj.pop("queue", None)
    if not isinstance(name, str) or not name:
        raise ValueError('give "queue": the name of a queue of the config')
    target = queues.get(name)
    if target is None:
        raise ValueError(f"queue {name!r} is not in the config")
    if obj.get("unique"):
        raise ValueError("unique: a follow-up is enqueued once already; give no unique")
    new = ndjson.job_from_object(obj, template)
    if len(new.payload) > target.max_payload:
        raise ValueError(
            f"payload of {len(new.payload)} bytes is above queue {name!r}'s max_payload "
            f"({target.max_payload})"
        )
    job_id = new.job_id
    if job_id is None:  # derived from the parent's (a job, not a template: no copy of it)
        job_id = follow_up_id(parent.job_id, n)
        object.__setattr__(new, "job_id", job_id)
    entry, _ = prepare(new, clock)
    entry.fields[PARENT] = parent_field
    if (wide := too_wide(entry.fields)) is not None:
        raise ValueError(wide)
    mark = target.keys.follow_up(queue.name, parent.job_id, parent.origin, n)
    fields = entry.fields
    return FollowUp(target, fields, entry.due, os.fsencode(job_id), mark, weight(fields))
