"""The dashboard: a page and its JSON API, served next to the metrics (``metrics.listen``) by
the daemon, or by ``jobd dashboard`` without one.

Everything it shows is read from Redis (``status``, ``figures``, ``dlq``), so any host's page
shows the whole cluster; one refresh costs three round trips per queue (its status pipeline,
the last hour of figures, its newest dead letters). The page and its script are files in the
package (``jobd/web/``): no CDN, no build step, works offline.

Safe by default: read-only, payloads hidden. With ``dashboard.token`` (a file or a systemd
credential), every request must carry it: ``Authorization: Bearer TOKEN``, or the cookie set by
opening ``/?token=TOKEN`` once (HttpOnly, SameSite=Strict). Actions (requeue, purge) need
``dashboard.actions: true`` (which needs a token), a POST, and the CSRF header
``X-Jobd-CSRF`` holding a value derived from the token that only a page served here can read.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
import urllib.parse
from collections.abc import Callable, Iterable
from importlib import resources
from typing import Any

import orjson
import redis

from jobd import dlq, figures, redisconn, status
from jobd.config import Config, QueueConfig
from jobd.scripts import Scripts

log = logging.getLogger("jobd.dashboard")

DEAD_LETTERS_SHOWN = 20
STDERR_SHOWN = 2048  # bytes of each record's stderr tail on the page
COOKIE = "jobd_token"
STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/static/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}
StartResponse = Callable[[str, list[tuple[str, str]]], object]


def overview(client: redis.Redis, config: Config, now: float | None = None) -> dict[str, Any]:
    """What the page shows, for every queue."""
    now = time.time() if now is None else now
    queues = {}
    for name, q in config.queues.items():
        queues[name] = status.with_levels(client, q, now)
        queues[name]["hour"] = figures.last_hour(client, q, now)
        queues[name]["dead_letters"] = dead_letters(client, q, config.dashboard.show_payloads)
    return {"redis": config.redis.describe(), "time": now, "queues": queues}


def dead_letters(client: redis.Redis, q: QueueConfig, show_payloads: bool) -> list[dict]:
    shown = []
    for record in dlq.records(client, q, DEAD_LETTERS_SHOWN):
        item = {
            "id": record.id,
            "job_id": record.get("jobd_job_id"),
            "error": record.get("jobd_error"),
            "exit_code": record.get("jobd_exit_code") or None,
            "signal": record.get("jobd_signal") or None,
            "attempts": record.get("jobd_attempts"),
            "failed_at": int(record.get("jobd_failed_at") or 0) / 1000,
            "stderr": record.get("jobd_stderr")[-STDERR_SHOWN:],
        }
        if show_payloads:
            item["payload"] = record.get("payload")
        shown.append(item)
    return shown


class Dashboard:
    """The WSGI application of the page and its API."""

    def __init__(self, config: Config, client: redis.Redis | None = None) -> None:
        self.config = config
        self.client = client or redisconn.client(config.redis, "jobd-dashboard")
        self.scripts = Scripts(self.client)
        token = config.dashboard.token
        self.token = token.encode() if token else None
        self.csrf = hmac.new(self.token, b"csrf", hashlib.sha256).hexdigest() if token else ""

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path, method = environ.get("PATH_INFO", "/"), environ.get("REQUEST_METHOD", "GET")
        query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""))
        if self.token is not None and path == "/" and "token" in query:
            return self.login(query["token"][0], start_response)
        if not self.authorized(environ):
            return _reply(start_response, "401 Unauthorized", {"error": "a valid token is needed"})
        try:
            if method == "GET" and path in STATIC:
                name, kind = STATIC[path]
                body = resources.files("jobd").joinpath("web", name).read_bytes()
                return _send(start_response, "200 OK", kind, body)
            if method == "GET" and path == "/api/overview":
                report = overview(self.client, self.config)
                report["actions"] = self.config.dashboard.actions
                report["csrf"] = self.csrf
                return _reply(start_response, "200 OK", report)
            if path.startswith("/api/dead-letters/"):
                return self.act(environ, path.rsplit("/", 1)[1], start_response)
        except redisconn.UNAVAILABLE as exc:
            where = self.config.redis.describe()
            return _reply(start_response, "503 Service Unavailable",
                          {"error": f"cannot reach Redis at {where}: {exc}"})  # fmt: skip
        return _reply(start_response, "404 Not Found", {"error": f"no page {path}"})

    def authorized(self, environ: dict[str, Any]) -> bool:
        if self.token is None:
            return True
        given = environ.get("HTTP_AUTHORIZATION", "").removeprefix("Bearer ").strip()
        if not given:
            cookies = dict(
                part.strip().split("=", 1)
                for part in environ.get("HTTP_COOKIE", "").split(";")
                if "=" in part
            )
            given = cookies.get(COOKIE, "")
        return hmac.compare_digest(given.encode(), self.token)

    def login(self, given: str, start_response: StartResponse) -> Iterable[bytes]:
        assert self.token is not None
        if not hmac.compare_digest(given.encode(), self.token):
            return _reply(start_response, "401 Unauthorized", {"error": "wrong token"})
        cookie = f"{COOKIE}={given}; HttpOnly; SameSite=Strict; Path=/"
        start_response("303 See Other", [("Location", "/"), ("Set-Cookie", cookie)])
        return [b""]

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
        try:
            size = int(environ.get("CONTENT_LENGTH") or 0)
            body = orjson.loads(environ["wsgi.input"].read(min(size, 1 << 20)) or b"{}")
            queue = self.config.queues[body["queue"]]
        except (ValueError, KeyError, TypeError, orjson.JSONDecodeError):
            return _reply(start_response, "400 Bad Request", {"error": "give a known queue"})
        if action == "requeue":
            if body.get("all"):
                moved = dlq.requeue_all(self.client, self.scripts, queue)
            else:
                moved = dlq.requeue(self.scripts, queue, [str(i) for i in body.get("ids", [])])
            log.info("dashboard: requeued %d dead letter(s) of queue %s", len(moved), queue.name)
            return _reply(start_response, "200 OK", {"requeued": moved})
        if action == "purge":
            count = dlq.purge(self.client, queue)
            log.info("dashboard: purged %d dead letter(s) of queue %s", count, queue.name)
            return _reply(start_response, "200 OK", {"purged": count})
        return _reply(start_response, "404 Not Found", {"error": f"no action {action}"})


def _send(start_response: StartResponse, code: str, kind: str, body: bytes) -> list[bytes]:
    start_response(
        code,
        [
            ("Content-Type", kind),
            ("Cache-Control", "no-store"),
            ("X-Content-Type-Options", "nosniff"),
            ("X-Frame-Options", "DENY"),
            ("Content-Security-Policy", "default-src 'self'; img-src 'self' data:"),
        ],
    )
    return [body]


def _reply(start_response: StartResponse, code: str, data: object) -> list[bytes]:
    return _send(start_response, code, "application/json", orjson.dumps(data))
