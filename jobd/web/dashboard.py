"""The dashboard: a page and its JSON API, served next to the metrics (``metrics.listen``) by
the daemon, or by ``jobd dashboard`` without one.

Everything it shows is read from Redis (``status``, ``figures``, ``dlq``, ``history``), so any
host's page shows the whole cluster; one refresh costs a few round trips per queue (its status
pipeline, the last hour of figures, its newest dead letters, its next delayed jobs, its running
jobs) and one for the events feed (``/api/events``: 1 MiB of events read in Redis at most, each
event's first 32 fields cut there, ``Store.events_feed``). A job is looked up by id
(``/api/job``: its history read only when 2 MiB or less, ``history.RECORDS_READ``). The page
and its script are files in the package (``jobd/web/static/``): no CDN, no build step, works
offline.

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
import urllib.parse
from collections.abc import Callable, Iterable
from importlib import resources
from typing import Any

import orjson
import redis

from jobd.config import Config, QueueConfig
from jobd.store import connection as redisconn
from jobd.store import figures, status
from jobd.store.browse import READ_BUDGET, DelayedShown
from jobd.store.keys import DAEMONS
from jobd.store.records import Event, Record, inexact_links, view_links
from jobd.store.store import Store
from jobd.web import actions, pages, shown
from jobd.web.actions import BadRequest
from jobd.web.paced import Paced

log = logging.getLogger("jobd.dashboard")

DELAYED_SHOWN = 5  # the next delayed jobs shown per queue
RUNNING_SHOWN = 200  # running jobs shown per queue, oldest first
EVENTS_SHOWN = 50  # events a feed request returns by default (at most EVENTS_MAX)
EVENTS_MAX = 500
RECORD_FIELDS = (  # what the page shows of a history record, besides its times
    "event", "entry", "stream", "attempt", "consumer", "host", "pid", "duration_ms",
    "exit_code", "signal", "error", "stdout", "stderr", "by", "new_entry", "owner",
)  # fmt: skip
RECORD_LINKS = ("batch", "batch_incarnation")  # … and of its links (docs/workflows.md)
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


def overview(store: Store, config: Config, query: object = None) -> dict[str, Any]:
    """Every queue with its figures, dead letters, delayed and running jobs: what the page
    showed before it had an overview and queue pages (kept for scripts that read it)."""
    clock = redisconn.Clock(store.client)  # Redis's time, not this host's
    queues = {}
    for name, q in config.queues.items():
        now = clock.at(q.stream)
        queues[name] = status.with_levels(store.client, q, now)
        queues[name]["hour"] = figures.last_hour(store.client, q, now)
        queues[name].update(_lists(store, q, config.dashboard.show_payloads))
        found = store.running_of([q], READ_BUDGET // max(1, len(config.queues)))[q.name]
        queues[name]["running_jobs"] = [shown.running(r) for r in found.jobs[:RUNNING_SHOWN]]
    report = {"redis": config.redis.describe(), "time": clock.at(DAEMONS), "queues": queues}
    return status.with_daemons(store.client, config, report)


def _lists(store: Store, q: QueueConfig, show_payloads: bool) -> dict[str, Any]:
    """A queue's newest dead letters and next delayed jobs; a key of another type empties its
    list and is said in ``errors`` (never a 500)."""
    lists: dict[str, Any] = {"dead_letters": [], "next_delayed": [], "errors": []}
    try:
        lists["dead_letters"] = dead_letters(store, q, show_payloads)
    except redis.ResponseError as exc:
        lists["errors"].append(pages.unreadable(store.client, pages.READ["dead"](q), exc))
    try:
        lists["next_delayed"] = next_delayed(store, q)
    except redis.ResponseError as exc:
        keys = {k: v for lvl in q.all_levels() for k, v in pages.READ["delayed"](lvl).items()}
        lists["errors"].append(pages.unreadable(store.client, keys, exc))
    return lists


def next_delayed(store: Store, q: QueueConfig) -> list[dict[str, Any]]:
    """The ``DELAYED_SHOWN`` jobs due soonest, of every priority level of the queue."""
    soonest: list[tuple[QueueConfig, DelayedShown]] = []
    for level in q.all_levels():
        page = store.delayed_shown(level, None, DELAYED_SHOWN, DELAYED_SHOWN,
                                   cap=shown.JOB_ID_SHOWN)  # fmt: skip
        soonest += [(level, d) for d in page.rows]
    soonest.sort(key=lambda pair: (pair[1].due_ms is None, pair[1].due_ms or 0))  # never: last
    return [shown.delayed(level, w) for level, w in soonest[:DELAYED_SHOWN]]


def dead_letters(store: Store, q: QueueConfig, show_payloads: bool) -> list[dict]:
    """The newest records, only the fields shown, cut in Redis (``Store.dead_letters_shown``):
    a record of any size costs the daemon a few KiB."""
    fields = shown.SHOWN if show_payloads else shown.SHOWN[:-1]
    asked = [(field, cap) for _, field, cap in fields]
    found = store.dead_letters_shown(q, shown.DEAD_LETTERS_SHOWN, asked)
    return [shown.dead_letter(s, fields) for s in found]


def job_lookup(store: Store, config: Config, query: dict[str, list[str]]) -> dict[str, Any]:
    """GET /api/job?queue=Q&id=J: where the job is now and its history, oldest first."""
    queue = actions.queue_of(config, {"queue": _one(query, "queue")})
    job_id = _one(query, "id")
    if not 0 < len(job_id) <= actions.MAX_JOB_ID:
        raise BadRequest(f"id is a job id of 1 to {actions.MAX_JOB_ID} characters")
    view = store.job(queue, job_id)
    return {
        "queue": view.queue, **shown.job_id_shown(view.job_id), "state": view.state,
        "now": view.now_ms / 1000, "due": shown.seconds(view.due_ms), "entry": view.entry,
        "stream": view.stream, "consumer": view.consumer, "skipped": view.skipped,
        "records_unread": view.unread,
        "running": None if view.running is None else shown.running(view.running),
        "records": [_record(rec) for rec in view.records],
        **view_links(view),  # parent, follow_ups, after, batch (which of the id; left): linked
        "links_inexact": inexact_links(view.records),  # … but these (shown as text)
    }  # fmt: skip


def _record(rec: Record) -> dict[str, Any]:
    """A history record as the page shows it: what it says (times in Unix seconds)."""
    said = {name: getattr(rec, name) for name in RECORD_FIELDS}
    for name in RECORD_LINKS:  # which batch (of its id) the record names: text or None
        said[name] = rec.raw[name] if isinstance(rec.raw.get(name), str) else None
    for name in ("at", "started", "due"):
        said[name] = shown.seconds(getattr(rec, name + "_ms"))
    return said


def events_feed(store: Store, config: Config, query: dict[str, list[str]]) -> dict[str, Any]:
    """GET /api/events[?after=CURSOR][&count=N]: the newest events of every queue, or those
    after CURSOR (a JSON object, queue -> event id, as the last reply gave it). When more than
    ``count`` came since, the newest are given with ``skipped``: the feed stays current."""
    count = _one(query, "count", str(EVENTS_SHOWN))
    if not (count.isascii() and count.isdigit() and 0 < int(count) <= EVENTS_MAX):
        raise BadRequest(f"count is a number of events, 1 to {EVENTS_MAX}")
    queues = list(config.queues.values())
    after = _cursor(config, query["after"][0]) if query.get("after") else None
    feed = store.events_feed(queues, after, int(count))
    events = [_event(e) for e in feed.events]
    return {"events": events, "after": feed.after, "skipped": feed.skipped}


def _event(event: Event) -> dict[str, Any]:
    """An event as the page shows it: its time, queue, and its first 32 fields, each name and
    value cut to 256 bytes in Redis (``cut``: those whose value was; ``fields_not_shown``: how
    many it holds besides those shown)."""
    at = int(event.id.split("-", 1)[0]) / 1000
    said = {"id": event.id, "queue": event.queue, "at": at, "fields": event.fields}
    if event.cut:
        said["cut"] = list(event.cut)
    if event.inexact:  # not UTF-8, shown escaped: never linked as the job its text names
        said["inexact"] = list(event.inexact)
    if event.width > len(event.fields):
        said["fields_not_shown"] = event.width - len(event.fields)
    return said


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
        self.store.know(config.queues.values())  # the config in force, for the notices it moves
        token = config.dashboard.token
        self.token = token.encode() if token else None
        self.csrf = hmac.new(self.token, b"csrf", hashlib.sha256).hexdigest() if token else ""
        # Names besides the listen address and localhost (server.host_allowed).
        self.allowed_hosts = tuple(getattr(config.dashboard, "allowed_hosts", None) or ())
        # Every queue's figures (/api/summary, /api/overview), read and rendered on the
        # daemon's process: one render at a time for both, shared by the requests waiting for
        # it, a quarter of a core at most (``paced``), leaving the daemon's loop its time.
        self.paced: Paced[bytes] = Paced()

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
        if method == "GET" and path in ("/api/overview", "/api/summary"):
            body = self.paced.get(path, lambda: self.report(path))
            return _send(start_response, "200 OK", "application/json", body)
        if method == "GET" and path in READS:
            return _reply(start_response, "200 OK", READS[path](self.store, self.config, query))
        if path.startswith("/api/dead-letters/") or path in actions.CONTROLS:
            return self.act(environ, path, start_response)
        return _reply(start_response, "404 Not Found", {"error": f"no page {path}"})

    def report(self, path: str) -> bytes:
        """Every queue at a glance (/api/summary), or the older overview with each queue's
        lists (/api/overview): the same for every client (a request's query is not read)."""
        report = (overview if path == "/api/overview" else pages.summary)(
            self.store, self.config, {}
        )
        report["actions"] = self.config.dashboard.actions
        report["csrf"] = self.csrf
        return orjson.dumps(report)

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


READS = {"/api/job": job_lookup, "/api/events": events_feed, **pages.READS}


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
