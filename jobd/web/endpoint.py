"""What a daemon (or a supervisor, for its host) serves on its metrics port: ``/metrics``,
``/healthz`` and the dashboard's page, on the bounded server of ``jobd.web.server``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, make_wsgi_app

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


def serve(metrics: Served, listen: str, page: Page | None = None) -> Server:
    """Serve on ``listen`` (HOST:PORT) from a daemon thread; returns the server. ``page``
    (the dashboard) answers every path but /metrics and /healthz, and its token guards
    /metrics too; /healthz says only whether the main loop turns over."""
    from jobd.web.server import serve_app

    prometheus = make_wsgi_app(metrics.registry)

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
