"""The dashboard: a page and its JSON API, served next to the metrics (``metrics.listen``) by
the daemon, or by ``jobd dashboard`` without one.

Everything it shows is read from Redis (``status``, ``figures``, ``dlq``, ``history``), so any
host's page shows the whole cluster; one refresh costs a few round trips per queue (its status
pipeline, the last hour of figures, its newest dead letters, its next delayed jobs, its running
jobs) and one for the events feed (``/api/events``). A job is looked up by id
(``/api/job``). The page and its script are files in the package (``jobd/web/static/``): no
CDN, no build step, works offline.

Safe by default: read-only, payloads hidden. With ``dashboard.token`` (a file or a systemd
credential), every request for data must carry it as ``Authorization: Bearer TOKEN``
(``/metrics`` too; ``/healthz`` says only ok or not); the page and its two files hold none and
load without it. No cookie ever carries it: a cookie is sent to every port of the host, and
any of them may set one. The page takes the token from its address's fragment
(``/#token=TOKEN``: no server, proxy or log sees a fragment) into sessionStorage (this origin
only, so this port only), drops it from the address bar, and sends it with every call. A
``token`` in a query is refused, right or wrong, and sets nothing (``TOKEN_IN_QUERY``).
Actions (requeue, purge; pause, resume, cancel: ``actions``) need ``dashboard.actions: true``
(which needs a token), a POST, and the CSRF header ``X-Jobd-CSRF`` holding a value derived
from the token that the API gives. A request naming another host (DNS rebinding) is refused
by the server (``server.host_allowed``). A record is read only in the fields shown, cut in
Redis, and a field jobd would not have written is shown as such, never failing the page; a
body is read to its Content-Length (``server.MAX_BODY`` at most) and checked. The page puts
what Redis holds into text nodes only, never into markup.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time
import urllib.parse
from collections.abc import Callable, Iterable
from importlib import resources
from typing import Any

import orjson
import redis

from jobd.config import Config, QueueConfig
from jobd.job import JOB_ID, RESERVED_ATTEMPT, RESERVED_JOB_ID
from jobd.store import connection as redisconn
from jobd.store import figures, status
from jobd.store.admin import Shown
from jobd.store.delayed import Waiting
from jobd.store.records import Event, Record, Running
from jobd.store.store import Store
from jobd.web import actions
from jobd.web.actions import BadRequest

log = logging.getLogger("jobd.dashboard")

DEAD_LETTERS_SHOWN = 20
STDERR_SHOWN = 2048  # bytes of each record's stderr tail on the page
PAYLOAD_SHOWN = 4096  # bytes of the head of each payload, when payloads are shown
FIELD_SHOWN = 256  # bytes of the head of every other field
# What the page shows of a record: its name there, the record's field, and the bytes Redis
# returns of it (the first N; -N: the last N). The payload comes last (shown or not).
SHOWN = (
    ("job_id", "jobd_job_id", FIELD_SHOWN), ("error", "jobd_error", FIELD_SHOWN),
    ("exit_code", "jobd_exit_code", FIELD_SHOWN), ("signal", "jobd_signal", FIELD_SHOWN),
    ("attempts", "jobd_attempts", FIELD_SHOWN), ("failed_at", "jobd_failed_at", FIELD_SHOWN),
    ("stderr", "jobd_stderr", -STDERR_SHOWN), ("payload", "payload", PAYLOAD_SHOWN),
)  # fmt: skip
DELAYED_SHOWN = 5  # the next delayed jobs shown per queue
RUNNING_SHOWN = 200  # running jobs shown per queue, oldest first
EVENTS_SHOWN = 50  # events a feed request returns by default (at most EVENTS_MAX)
EVENTS_MAX = 500
RECORD_FIELDS = (  # what the page shows of a history record, besides its times
    "event", "entry", "stream", "attempt", "consumer", "host", "pid", "duration_ms",
    "exit_code", "signal", "error", "stdout", "stderr", "by", "new_entry", "owner",
)  # fmt: skip
TOKEN_IN_QUERY = (
    "a token in the query is refused: servers, proxies and the browser's history keep it "
    "(consider that one seen). Open /#token=TOKEN instead: a fragment is sent to no server"
)
STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/static/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}
StartResponse = Callable[[str, list[tuple[str, str]]], object]


def overview(store: Store, config: Config, now: float | None = None) -> dict[str, Any]:
    """What the page shows, for every queue."""
    now = time.time() if now is None else now
    queues = {}
    for name, q in config.queues.items():
        queues[name] = status.with_levels(store.client, q, now)
        queues[name]["hour"] = figures.last_hour(store.client, q, now)
        queues[name]["dead_letters"] = dead_letters(store, q, config.dashboard.show_payloads)
        queues[name]["next_delayed"] = next_delayed(store, q)
        queues[name]["running_jobs"] = [_running(r) for r in store.running(q)[:RUNNING_SHOWN]]
    return {"redis": config.redis.describe(), "time": now, "queues": queues}


def next_delayed(store: Store, q: QueueConfig) -> list[dict[str, Any]]:
    """The ``DELAYED_SHOWN`` jobs due soonest, of every priority level of the queue."""
    soonest: list[tuple[QueueConfig, Waiting]] = []
    for level in q.all_levels():
        soonest += [(level, w) for w in store.delayed_list(level, DELAYED_SHOWN)]
    soonest.sort(key=lambda pair: pair[1].due_ms)
    return [_delayed(level, w) for level, w in soonest[:DELAYED_SHOWN]]


def _delayed(level: QueueConfig, w: Waiting) -> dict[str, Any]:
    """A delayed job as the page shows it: when it is due, its job id and attempt (none of its
    payload); a member that is not a job says why."""
    job_id = w.fields.get(JOB_ID) or w.fields.get(RESERVED_JOB_ID)
    item: dict[str, Any] = {
        "due": w.due_ms / 1000,
        "job_id": None if job_id is None else _text(job_id[:FIELD_SHOWN]),
        "attempt": _text(w.fields.get(RESERVED_ATTEMPT, b"1")[:FIELD_SHOWN]) if w.fields else None,
        "level": level.priority,
    }
    if w.malformed:
        item["bad"] = w.malformed[:FIELD_SHOWN]
    return item


def dead_letters(store: Store, q: QueueConfig, show_payloads: bool) -> list[dict]:
    """The newest records, only the fields shown, cut in Redis (``Store.dead_letters_shown``):
    a record of any size costs the daemon a few KiB."""
    fields = SHOWN if show_payloads else SHOWN[:-1]
    asked = [(field, cap) for _, field, cap in fields]
    shown = store.dead_letters_shown(q, DEAD_LETTERS_SHOWN, asked)
    return [_dead_letter(s, fields) for s in shown]


def _dead_letter(shown: Shown, fields: tuple[tuple[str, str, int], ...]) -> dict[str, Any]:
    """One record as the page shows it; a field jobd would not have written is shown as it is,
    with why the record is bad, never failing the page."""
    item: dict[str, Any] = {"id": shown.id}
    cut = []
    for (name, _, cap), (value, length) in zip(fields, shown.values, strict=True):
        item[name] = _text(value)
        if length > abs(cap):
            cut.append(name)
    item["exit_code"] = item["exit_code"] or None
    item["signal"] = item["signal"] or None
    item["failed_at"], bad = _failed_at(item["failed_at"], "failed_at" in cut)
    if bad:
        item["bad"] = bad
    if cut:
        item["cut"] = cut  # only the tail of stderr, the head of the others
    return item


def _failed_at(text: str, cut: bool) -> tuple[float | None, str | None]:
    """Seconds since the epoch from jobd_failed_at (milliseconds), or None and why not."""
    if not text:
        return None, "no jobd_failed_at"
    try:
        if cut:
            raise ValueError(text)
        return int(text) / 1000, None
    except (ValueError, OverflowError):
        return None, "jobd_failed_at is not a time in milliseconds"


def _text(value: bytes | None) -> str:
    return "" if value is None else value.decode("utf-8", "backslashreplace")


def _seconds(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


def _job_id(job_id: str) -> dict[str, Any]:
    """A job id as the page shows it, and whether the page can name it back exactly (cancel,
    lookup): not when it is not UTF-8 (shown with escapes) or is longer than an action takes."""
    raw = os.fsencode(job_id)
    text = raw.decode("utf-8", "backslashreplace")
    exact = text == raw.decode("utf-8", "replace") and len(text) <= actions.MAX_JOB_ID
    return {"job_id": text} if exact else {"job_id": text, "inexact": True}


def _running(r: Running) -> dict[str, Any]:
    """A running job as the page shows it (times: Unix seconds on Redis's clock)."""
    return {
        **_job_id(r.job_id), "stream": r.stream, "entry": r.entry, "consumer": r.consumer,
        "host": r.host, "pid": r.pid, "since": _seconds(r.since_ms), "attempt": r.attempt,
        "deadline": _seconds(r.deadline_ms),
    }  # fmt: skip


def job_lookup(store: Store, config: Config, query: dict[str, list[str]]) -> dict[str, Any]:
    """GET /api/job?queue=Q&id=J: where the job is now and its history, oldest first."""
    queue = actions.queue_of(config, {"queue": _one(query, "queue")})
    job_id = _one(query, "id")
    if not 0 < len(job_id) <= actions.MAX_JOB_ID:
        raise BadRequest(f"id is a job id of 1 to {actions.MAX_JOB_ID} characters")
    view = store.job(queue, job_id)
    return {
        "queue": view.queue, **_job_id(view.job_id), "state": view.state,
        "now": view.now_ms / 1000, "due": _seconds(view.due_ms), "entry": view.entry,
        "stream": view.stream, "consumer": view.consumer, "skipped": view.skipped,
        "running": None if view.running is None else _running(view.running),
        "records": [_record(rec) for rec in view.records],
    }  # fmt: skip


def _record(rec: Record) -> dict[str, Any]:
    """A history record as the page shows it: what it says (times in Unix seconds)."""
    shown = {name: getattr(rec, name) for name in RECORD_FIELDS}
    for name in ("at", "started", "due"):
        shown[name] = _seconds(getattr(rec, name + "_ms"))
    return shown


def events_feed(store: Store, config: Config, query: dict[str, list[str]]) -> dict[str, Any]:
    """GET /api/events[?after=CURSOR][&count=N]: the newest events of every queue, or those
    after CURSOR (a JSON object, queue -> event id, as the last reply gave it). When more than
    ``count`` came since, the newest are given with ``skipped``: the feed stays current."""
    count = _one(query, "count", str(EVENTS_SHOWN))
    if not (count.isascii() and count.isdigit() and 0 < int(count) <= EVENTS_MAX):
        raise BadRequest(f"count is a number of events, 1 to {EVENTS_MAX}")
    queues = list(config.queues.values())
    after = _cursor(config, query["after"][0]) if query.get("after") else None
    found = store.events(queues, after, int(count) + 1) if after is not None else []
    skipped = len(found) > int(count)
    if after is None or skipped:
        found = store.events(queues, None, int(count))
        oldest = found[0].id if found else "0-0"
        after = {q.name: oldest for q in queues}  # every queue's older events: all before it
    for event in found:
        after[event.queue] = event.id
    return {"events": [_event(e) for e in found], "after": after, "skipped": skipped}


def _event(event: Event) -> dict[str, Any]:
    """An event as the page shows it: its time, queue, and (the first 32 of) its fields."""
    fields = dict(list(event.fields.items())[:32])
    shown = {k[:FIELD_SHOWN]: v[:FIELD_SHOWN] for k, v in fields.items()}
    at = int(event.id.split("-", 1)[0]) / 1000
    return {"id": event.id, "queue": event.queue, "at": at, "fields": shown}


def _cursor(config: Config, text: str) -> dict[str, str]:
    """A feed's cursor as the page sends it back: {queue: event id}; a queue the config no
    longer has is left out."""
    try:
        cursor = orjson.loads(text)
    except orjson.JSONDecodeError:
        cursor = None
    if not isinstance(cursor, dict) or not all(
        isinstance(i, str) and actions.RECORD_ID.fullmatch(i) for i in cursor.values()
    ):
        raise BadRequest("after is the cursor the last reply gave: {queue: event id}")
    return {name: i for name, i in cursor.items() if name in config.queues}


def _one(query: dict[str, list[str]], name: str, default: str | None = None) -> str:
    """The one value of query parameter ``name``."""
    values = query.get(name, [] if default is None else [default])
    if len(values) != 1:
        raise BadRequest(f"give {name} once")
    return values[0]


class Dashboard:
    """The WSGI application of the page and its API."""

    def __init__(self, config: Config, client: redis.Redis | None = None) -> None:
        self.config = config
        self.store = Store(client) if client is not None else Store.open(config.redis, "dashboard")
        token = config.dashboard.token
        self.token = token.encode() if token else None
        self.csrf = hmac.new(self.token, b"csrf", hashlib.sha256).hexdigest() if token else ""
        # Names besides the listen address and localhost (server.host_allowed).
        self.allowed_hosts = tuple(getattr(config.dashboard, "allowed_hosts", None) or ())

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        try:
            return self.route(environ, start_response)
        except BadRequest as exc:
            return _reply(start_response, exc.code, {"error": str(exc)})
        except redisconn.UNAVAILABLE as exc:
            where = self.config.redis.describe()
            return _reply(start_response, "503 Service Unavailable",
                          {"error": f"cannot reach Redis at {where}: {exc}"})  # fmt: skip
        except Exception:
            log.exception("dashboard: %s %s failed", environ.get("REQUEST_METHOD"), _path(environ))
            return _reply(start_response, "500 Internal Server Error",
                          {"error": "the dashboard failed: see the log"})  # fmt: skip

    def route(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path, method = _path(environ), environ.get("REQUEST_METHOD", "GET")
        query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        if "token" in query:
            raise BadRequest(TOKEN_IN_QUERY)
        if method == "GET" and path in STATIC:
            return _static(path, start_response)
        if not self.authorized(environ):
            return _reply(start_response, "401 Unauthorized", {"error": "a valid token is needed"})
        if method == "GET" and path == "/api/overview":
            report = overview(self.store, self.config)
            report["actions"] = self.config.dashboard.actions
            report["csrf"] = self.csrf
            return _reply(start_response, "200 OK", report)
        if method == "GET" and path in READS:
            return _reply(start_response, "200 OK", READS[path](self.store, self.config, query))
        if path.startswith("/api/dead-letters/") or path in actions.CONTROLS:
            return self.act(environ, path, start_response)
        return _reply(start_response, "404 Not Found", {"error": f"no page {path}"})

    def authorized(self, environ: dict[str, Any]) -> bool:
        """Whether the request carries the token as ``Authorization: Bearer TOKEN`` (the only
        way: a cookie is never looked at)."""
        if self.token is None:
            return True
        given = environ.get("HTTP_AUTHORIZATION", "").removeprefix("Bearer ").strip()
        return hmac.compare_digest(given.encode(), self.token)

    def act(
        self, environ: dict[str, Any], path: str, start_response: StartResponse
    ) -> Iterable[bytes]:
        """A POST action (``actions``): refused unless actions are on and the CSRF header is
        there."""
        reply = actions.refused(self.config, self.csrf, environ)
        if reply is None:
            name = path.rsplit("/", 1)[1]
            run = actions.dead_letters if path.startswith("/api/dead-letters/") else actions.control
            reply = run(self.store, self.config, environ, name)
        return _reply(start_response, *reply)


READS = {"/api/job": job_lookup, "/api/events": events_feed}


def _path(environ: dict[str, Any]) -> str:
    return environ.get("PATH_INFO", "/")


def _static(path: str, start_response: StartResponse) -> list[bytes]:
    """The page or one of its files: code from the package, no data."""
    name, kind = STATIC[path]
    body = resources.files("jobd.web").joinpath("static", name).read_bytes()
    return _send(start_response, "200 OK", kind, body)


def _send(start_response: StartResponse, code: str, kind: str, body: bytes) -> list[bytes]:
    start_response(
        code,
        [
            ("Content-Type", kind),
            ("Cache-Control", "no-store"),
            ("X-Content-Type-Options", "nosniff"),
            ("X-Frame-Options", "DENY"),
            ("Referrer-Policy", "no-referrer"),
            ("Content-Security-Policy", "default-src 'self'; img-src 'self' data:"),
        ],
    )
    return [body]


def _reply(start_response: StartResponse, code: str, data: object) -> list[bytes]:
    return _send(start_response, code, "application/json", orjson.dumps(data))
