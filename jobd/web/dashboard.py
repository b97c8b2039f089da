"""The dashboard: a page and its JSON API, served next to the metrics (``metrics.listen``) by
the daemon, or by ``jobd dashboard`` without one.

Everything it shows is read from Redis (``status``, ``figures``, ``dlq``), so any host's page
shows the whole cluster; one refresh costs three round trips per queue (its status pipeline,
the last hour of figures, its newest dead letters). The page and its script are files in the
package (``jobd/web/static/``): no CDN, no build step, works offline.

Safe by default: read-only, payloads hidden. With ``dashboard.token`` (a file or a systemd
credential), every request for data must carry it as ``Authorization: Bearer TOKEN``
(``/metrics`` too; ``/healthz`` says only ok or not); the page and its two files hold none and
load without it. No cookie ever carries it: a cookie is sent to every port of the host, and
any of them may set one. The page takes the token from its address's fragment
(``/#token=TOKEN``: no server, proxy or log sees a fragment) into sessionStorage (this origin
only, so this port only), drops it from the address bar, and sends it with every call. A
``token`` in a query is refused, right or wrong, and sets nothing (``TOKEN_IN_QUERY``).
Actions (requeue, purge) need ``dashboard.actions: true`` (which needs a token), a POST, and
the CSRF header ``X-Jobd-CSRF`` holding a value derived from the token that the API gives. A
request naming another host (DNS rebinding) is refused by the server (``server.host_allowed``).
A record is read only in the fields shown, cut in Redis, and a field jobd would not have
written is shown as such, never failing the page; a body is read to its Content-Length
(``server.MAX_BODY`` at most) and checked.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import time
import urllib.parse
from collections.abc import Callable, Iterable
from importlib import resources
from typing import Any

import orjson
import redis

from jobd import dlq
from jobd.config import Config, QueueConfig
from jobd.store import connection as redisconn
from jobd.store import figures, status
from jobd.store.admin import Shown
from jobd.store.store import Store
from jobd.web.server import MAX_BODY

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
MAX_IDS = 1000  # record ids in one requeue
RECORD_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")
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
    return {"redis": config.redis.describe(), "time": now, "queues": queues}


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


class BadRequest(Exception):
    """A request the dashboard refuses, with the status and why."""

    def __init__(self, why: str, code: str = "400 Bad Request") -> None:
        super().__init__(why)
        self.code = code


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
        if path.startswith("/api/dead-letters/"):
            return self.act(environ, path.rsplit("/", 1)[1], start_response)
        return _reply(start_response, "404 Not Found", {"error": f"no page {path}"})

    def authorized(self, environ: dict[str, Any]) -> bool:
        """Whether the request carries the token as ``Authorization: Bearer TOKEN`` (the only
        way: a cookie is never looked at)."""
        if self.token is None:
            return True
        given = environ.get("HTTP_AUTHORIZATION", "").removeprefix("Bearer ").strip()
        return hmac.compare_digest(given.encode(), self.token)

    def act(
        self, environ: dict[str, Any], action: str, start_response: StartResponse
    ) -> Iterable[bytes]:
        """POST /api/dead-letters/requeue {queue, ids | all} and /purge {queue}."""
        if not self.config.dashboard.actions:
            return _reply(start_response, "403 Forbidden", {"error": "actions are off"})
        if environ.get("REQUEST_METHOD") != "POST":
            return _reply(start_response, "405 Method Not Allowed", {"error": "POST only"})
        if not hmac.compare_digest(
            environ.get("HTTP_X_JOBD_CSRF", "").encode(), self.csrf.encode()
        ):
            return _reply(start_response, "403 Forbidden", {"error": "missing CSRF header"})
        if action not in ("requeue", "purge"):
            return _reply(start_response, "404 Not Found", {"error": f"no action {action}"})
        body = _json_body(environ)
        queue = self.queue(body)
        if action == "purge":
            count = dlq.purge(self.store, queue)
            log.info("dashboard: purged %d dead letter(s) of queue %s", count, queue.name)
            return _reply(start_response, "200 OK", {"purged": count})
        moved = self.requeue(queue, body)
        log.info("dashboard: requeued %d dead letter(s) of queue %s", len(moved), queue.name)
        return _reply(start_response, "200 OK", {"requeued": moved})

    def queue(self, body: dict[str, Any]) -> QueueConfig:
        name = body.get("queue")
        if not isinstance(name, str) or name not in self.config.queues:
            raise BadRequest("give a known queue")
        return self.config.queues[name]

    def requeue(self, queue: QueueConfig, body: dict[str, Any]) -> list[str]:
        every = body.get("all", False)
        if not isinstance(every, bool):
            raise BadRequest("all is true or false")
        if every:
            return dlq.requeue_all(self.store, queue)
        return dlq.requeue(self.store, queue, _record_ids(body.get("ids", [])))


def _path(environ: dict[str, Any]) -> str:
    return environ.get("PATH_INFO", "/")


def _json_body(environ: dict[str, Any]) -> dict[str, Any]:
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
        raise BadRequest("the body is a JSON object: {queue, ids | all}")
    return body


def _record_ids(ids: object) -> list[str]:
    if (
        not isinstance(ids, list)
        or len(ids) > MAX_IDS
        or not all(isinstance(i, str) and RECORD_ID.fullmatch(i) for i in ids)
    ):
        raise BadRequest(
            f"ids is a list of at most {MAX_IDS} dead-letter record ids (like 1795960000000-0)"
        )
    return ids


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
