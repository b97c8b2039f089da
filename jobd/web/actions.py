"""What the dashboard does, not only shows: its POST actions, each behind the same guards.

Dead letters: ``/api/dead-letters/requeue {queue, ids | all}`` and ``/purge {queue}``
(``jobd.dlq``). Operator controls, as ``jobd pause``/``resume``/``cancel`` do them
(``jobd.cancel``): ``/api/pause {queue}``, ``/api/resume {queue}`` and ``/api/cancel
{queue, job_ids}``, which says where each job was found (running, waiting, delayed, or nowhere
yet: it stays cancelled for ``CANCEL_UNSEEN``).

Every action needs the token (checked before, by the dashboard), ``dashboard.actions: true``,
a POST, and the CSRF header ``X-Jobd-CSRF``; its body is a JSON object read to its
Content-Length and checked field by field (400 with the reason). The audit trail names the
dashboard's user as ``dashboard:ADDRESS@HOST``: the client's address (``REMOTE_ADDR``) and this
host's name, where a command names ``user@host``.
"""

from __future__ import annotations

import hmac
import logging
import re
import socket
from typing import Any

import orjson

from jobd import dlq
from jobd.cancel import cancel, where
from jobd.config import Config, QueueConfig
from jobd.store.control import Found, Paused
from jobd.store.store import Store
from jobd.web.server import MAX_BODY

log = logging.getLogger("jobd.dashboard")

MAX_IDS = 1000  # record ids in one requeue
RECORD_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")
MAX_JOB_IDS = 100  # job ids in one cancel
MAX_JOB_ID = 1024  # characters of a job id asked for (cancel, lookup)
CANCEL_UNSEEN = 3600.0  # seconds a job found nowhere stays cancelled (`jobd cancel --unseen-for`)
CONTROLS = ("/api/pause", "/api/resume", "/api/cancel")
Reply = tuple[str, Any]  # an HTTP status and the JSON to send


class BadRequest(Exception):
    """A request the dashboard refuses, with the status and why."""

    def __init__(self, why: str, code: str = "400 Bad Request") -> None:
        super().__init__(why)
        self.code = code


def refused(config: Config, csrf: str, environ: dict[str, Any]) -> Reply | None:
    """Why this action request is refused, if it is: actions off, not a POST, no CSRF header."""
    if not config.dashboard.actions:
        return "403 Forbidden", {"error": "actions are off"}
    if environ.get("REQUEST_METHOD") != "POST":
        return "405 Method Not Allowed", {"error": "POST only"}
    given = environ.get("HTTP_X_JOBD_CSRF", "").encode()
    if not hmac.compare_digest(given, csrf.encode()):
        return "403 Forbidden", {"error": "missing CSRF header"}
    return None


def dead_letters(store: Store, config: Config, environ: dict[str, Any], action: str) -> Reply:
    """POST /api/dead-letters/requeue {queue, ids | all} and /purge {queue}."""
    if action not in ("requeue", "purge"):
        return "404 Not Found", {"error": f"no action {action}"}
    body = json_body(environ)
    queue = queue_of(config, body)
    by = operator(environ)
    if action == "purge":
        count = dlq.purge(store, queue, by)
        log.info("dashboard: %s purged %d dead letter(s) of queue %s", by, count, queue.name)
        return "200 OK", {"purged": count}
    every = body.get("all", False)
    if not isinstance(every, bool):
        raise BadRequest("all is true or false")
    if every:
        moved = dlq.requeue_all(store, queue, by)
    else:
        moved = dlq.requeue(store, queue, record_ids(body.get("ids", [])), by)
    log.info("dashboard: %s requeued %d dead letter(s) of queue %s", by, len(moved), queue.name)
    return "200 OK", {"requeued": moved}


def control(store: Store, config: Config, environ: dict[str, Any], action: str) -> Reply:
    """POST /api/pause {queue}, /api/resume {queue}, /api/cancel {queue, job_ids}."""
    body = json_body(environ)
    queue = queue_of(config, body)
    by = operator(environ)
    if action == "pause":
        state, made = store.pause(queue, by)
        log.info("dashboard: %s paused queue %s (%s)", by, queue.name,
                 "now" if made else "already paused")  # fmt: skip
        return "200 OK", {"queue": queue.name, "paused": pause_shown(state), "made": made}
    if action == "resume":
        ended = store.resume(queue, by)
        log.info("dashboard: %s resumed queue %s (%s)", by, queue.name,
                 "was paused" if ended else "was not paused")  # fmt: skip
        return "200 OK", {"queue": queue.name, "resumed": pause_shown(ended)}
    ids = job_ids(body.get("job_ids"))
    unseen = CANCEL_UNSEEN
    found = cancel(store, queue, ids, int(unseen * 1000), by)
    log.info("dashboard: %s cancelled job(s) %s of queue %s: %s", by, ids, queue.name,
             ", ".join(f.where for f in found))  # fmt: skip
    # "wait": the old name of "unseen_for", kept for scripts that read it.
    return "200 OK", {"queue": queue.name, "unseen_for": unseen, "wait": unseen,
                      "found": [found_shown(f, unseen) for f in found]}  # fmt: skip


def operator(environ: dict[str, Any]) -> str:
    """Who acts, as the audit trail names them: ``dashboard:ADDRESS@HOST``."""
    address = str(environ.get("REMOTE_ADDR") or "?")[:64]
    return f"dashboard:{address}@{socket.gethostname()}"


def pause_shown(state: Paused | None) -> dict[str, Any] | None:
    """A pause as the API gives it (as ``jobd status --json`` does): Unix seconds and who."""
    return None if state is None else {"since": state.since_ms / 1000, "by": state.by}


def found_shown(f: Found, unseen: float) -> dict[str, Any]:
    """Where a cancel found a job, and what that means, in `jobd cancel`'s words."""
    return {
        "job_id": f.job_id, "where": f.where, "consumer": f.consumer, "entry": f.entry,
        "due": f.due_ms / 1000 if f.where == "delayed" and f.due_ms is not None else None,
        "said": where(f, f"{unseen:g}s"),
    }  # fmt: skip


def queue_of(config: Config, body: dict[str, Any]) -> QueueConfig:
    """The queue a body names (``queue``), one of the config's."""
    name = body.get("queue")
    if not isinstance(name, str) or name not in config.queues:
        raise BadRequest("give a known queue")
    return config.queues[name]


def json_body(environ: dict[str, Any]) -> dict[str, Any]:
    """The request's JSON object, read to its Content-Length and no further."""
    length = environ.get("CONTENT_LENGTH") or "0"
    if not re.fullmatch("[0-9]+", length):
        raise BadRequest("Content-Length is not a number of bytes")
    if len(length) > 9 or int(length) > MAX_BODY:
        raise BadRequest(f"a body is at most {MAX_BODY} bytes", "413 Content Too Large")
    size = int(length)
    raw = environ["wsgi.input"].read(size) if size else b""
    if len(raw) < size:
        raise BadRequest("the body is shorter than its Content-Length")
    try:
        body = orjson.loads(raw or b"{}")
    except orjson.JSONDecodeError:
        raise BadRequest("the body is not JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the body is a JSON object: {queue, …}")
    return body


def record_ids(ids: object) -> list[str]:
    """Dead-letter record ids, as a requeue takes them."""
    if (
        not isinstance(ids, list)
        or len(ids) > MAX_IDS
        or not all(isinstance(i, str) and RECORD_ID.fullmatch(i) for i in ids)
    ):
        raise BadRequest(
            f"ids is a list of at most {MAX_IDS} dead-letter record ids (like 1795960000000-0)"
        )
    return ids


def job_ids(ids: object) -> list[str]:
    """Job ids, as a cancel takes them: 1 to MAX_JOB_IDS strings, none empty or too long."""
    if (
        not isinstance(ids, list)
        or not 0 < len(ids) <= MAX_JOB_IDS
        or not all(isinstance(i, str) and 0 < len(i) <= MAX_JOB_ID for i in ids)
    ):
        raise BadRequest(
            f"job_ids is a list of 1 to {MAX_JOB_IDS} job ids, each 1 to {MAX_JOB_ID} characters"
        )
    return list(dict.fromkeys(ids))
