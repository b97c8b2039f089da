"""What a daemon (or a supervisor, for its host) serves on its metrics port: ``/metrics``,
``/healthz`` and the dashboard's page, on the bounded server of ``jobd.web.server``."""

from __future__ import annotations

import gzip
import urllib.parse
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import choose_encoder, gzip_accepted

from jobd.web.paced import METRICS_KEEP, METRICS_RATE, Paced, Spaced

if TYPE_CHECKING:  # the server (waitress) is imported by ``serve``: a daemon that serves no
    from jobd.web.server import Server  # metrics never needs it


class Served(Protocol):
    """What ``serve`` needs of the metrics: a registry, and whether to say ok."""

    registry: CollectorRegistry
    unhealthy: bytes

    def healthy(self) -> bool: ...


class Page(Protocol):
    """What ``serve`` needs of the dashboard: the app, its token check, and the names it may
    be reached by."""

    allowed_hosts: tuple[str, ...]

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]: ...

    def authorized(self, environ: dict[str, Any]) -> bool: ...


def paced_metrics(registry: CollectorRegistry) -> Any:
    """prometheus_client's app, but a GET's answer rendered at most once per METRICS_KEEP
    seconds for each format asked and served to every request in between, at a pace that
    leaves the daemon's loop its time (``paced.Paced``): a client asking for /metrics again
    and again no longer renders 50 queues' series each time on the daemon's process."""
    other = make_wsgi_app(registry)  # OPTIONS, or a method refused
    paced: Paced[tuple[list[tuple[str, str]], bytes]] = Paced(keep=METRICS_KEEP)

    def app(environ, start_response):  # type: ignore[no-untyped-def]
        if environ.get("REQUEST_METHOD") != "GET":
            return other(environ, start_response)
        encoder, kind = choose_encoder(environ.get("HTTP_ACCEPT"))
        zipped = gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING"))
        names = tuple(urllib.parse.parse_qs(environ.get("QUERY_STRING", "")).get("name[]", ()))

        def render() -> tuple[list[tuple[str, str]], bytes]:
            output = encoder(registry.restricted_registry(names) if names else registry)
            if zipped:
                return [("Content-Type", kind), ("Content-Encoding", "gzip")], gzip.compress(output)
            return [("Content-Type", kind)], output

        headers, output = paced.get((kind, zipped, names), render)
        start_response("200 OK", list(headers))
        return [output]

    return app


def serve(metrics: Served, listen: str, page: Page | None = None) -> Server:
    """Serve on ``listen`` (HOST:PORT) from a daemon thread; returns the server. ``page``
    (the dashboard) answers every path but /metrics and /healthz, and its token guards
    /metrics too; /healthz says only whether the main loop turns over."""
    from jobd.web.server import serve_app

    prometheus = paced_metrics(metrics.registry)
    spaced = Spaced(METRICS_RATE)

    def app(environ, start_response):  # type: ignore[no-untyped-def]
        path = environ.get("PATH_INFO")
        if path == "/healthz":
            ok = metrics.healthy()
            start_response(
                "200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")]
            )
            return [b"ok\n" if ok else metrics.unhealthy]
        if page is not None and path != "/metrics":
            return page(environ, start_response)
        spaced.wait()  # /metrics: METRICS_RATE answers a second at most, refusals included
        if page is not None and not page.authorized(environ):
            start_response(
                "401 Unauthorized",
                [("Content-Type", "text/plain"), ("WWW-Authenticate", 'Bearer realm="jobd"')],
            )
            return [b"a valid token is needed: Authorization: Bearer TOKEN\n"]
        return prometheus(environ, start_response)

    hosts = page.allowed_hosts if page is not None else ()
    # Neither needs Redis: they never wait behind the dashboard's requests, which may; each has
    # workers of its own, so a client asking for /metrics again and again never delays a probe.
    # At the connection cap a queued /metrics request is shed as a page's is; a probe's never.
    return serve_app(
        app, listen, "metrics", hosts, apart=("/healthz", "/metrics"), kept=("/healthz",)
    )
