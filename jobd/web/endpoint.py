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


EOF = b"# EOF\n"  # OpenMetrics's last line
CUTS = 16  # answers cut from one render and kept with it (selections, gzipped or not)


class Exposition:
    """One whole render of /metrics in one format, and the answers cut from it: a ``name[]``
    selection is its families' lines whose sample names are selected (what
    ``restricted_registry`` renders: a family with none selected is left out), cut from this
    text without a walk of the registry; each answer, gzipped or not, kept for the selected
    names found (names it does not hold select nothing, so a new one costs no new answer)."""

    def __init__(self, output: bytes) -> None:
        self.output = output
        self.families: list[tuple[list[bytes], list[tuple[bytes, bytes]]]] | None = None
        self.names: frozenset[bytes] = frozenset()
        self.cuts: dict[tuple[frozenset[bytes] | None, bool], bytes] = {}

    def answer(self, names: tuple[str, ...], zipped: bool) -> bytes:
        """The whole render (no ``names``) or the selection of ``names``, gzipped or not."""
        chosen = self._chosen(names) if names else None
        key = (chosen, zipped)
        cut = self.cuts.get(key)
        if cut is None:
            cut = self.output if chosen is None else self._cut(chosen)
            cut = gzip.compress(cut) if zipped else cut
            if len(self.cuts) >= CUTS:
                self.cuts.clear()
            self.cuts[key] = cut  # two workers may cut the same: either answer is right
        return cut

    def _chosen(self, names: tuple[str, ...]) -> frozenset[bytes]:
        if self.families is None:
            self._index()
        return self.names.intersection(n.encode() for n in names)

    def _index(self) -> None:
        """Each family: its comment lines (# HELP, # TYPE, # UNIT) and its samples by name."""
        families: list[tuple[list[bytes], list[tuple[bytes, bytes]]]] = []
        for line in self.output.splitlines(keepends=True):
            if line.startswith(b"#"):
                if not families or families[-1][1] or line.startswith((b"# HELP ", EOF)):
                    families.append(([], []))
                families[-1][0].append(line)
            elif line.strip():
                if not families:
                    families.append(([], []))
                name = line.split(b"{", 1)[0].split(b" ", 1)[0]
                families[-1][1].append((name, line))
        self.names = frozenset(n for _, samples in families for n, _ in samples)
        self.families = families

    def _cut(self, chosen: frozenset[bytes]) -> bytes:
        out: list[bytes] = []
        for comments, samples in self.families or ():
            kept = [line for name, line in samples if name in chosen]
            if kept:
                out += comments
                out += kept
            elif comments == [EOF]:  # OpenMetrics's end
                out += comments
        return b"".join(out)


def paced_metrics(registry: CollectorRegistry) -> Any:
    """prometheus_client's app, but a GET's answer rendered whole at most once per
    METRICS_KEEP seconds for each format asked (text or OpenMetrics) and served to every
    request in between, at a pace that leaves the daemon's loop its time (``paced.Paced``);
    a ``name[]`` selection, and gzip, are cut from that render (``Exposition``): a client
    asking for /metrics again and again, with any selection, never renders 50 queues' series
    each time on the daemon's process, nor keeps a scrape waiting behind renders of its own."""
    other = make_wsgi_app(registry)  # OPTIONS, or a method refused
    paced: Paced[Exposition] = Paced(keep=METRICS_KEEP)

    def app(environ, start_response):  # type: ignore[no-untyped-def]
        if environ.get("REQUEST_METHOD") != "GET":
            return other(environ, start_response)
        encoder, kind = choose_encoder(environ.get("HTTP_ACCEPT"))
        zipped = gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING"))
        names = tuple(urllib.parse.parse_qs(environ.get("QUERY_STRING", "")).get("name[]", ()))
        whole = paced.get(kind, lambda: Exposition(encoder(registry)))
        output = whole.answer(names, zipped)
        headers = [("Content-Type", kind)]
        start_response("200 OK", [*headers, ("Content-Encoding", "gzip")] if zipped else headers)
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
        if page is not None and not page.authorized(environ):  # at once: a refusal is cheap
            start_response(
                "401 Unauthorized",
                [("Content-Type", "text/plain"), ("WWW-Authenticate", 'Bearer realm="jobd"')],
            )
            return [b"a valid token is needed: Authorization: Bearer TOKEN\n"]
        spaced.wait()  # /metrics: METRICS_RATE answers a second at most (refusals not counted)
        return prometheus(environ, start_response)

    hosts = page.allowed_hosts if page is not None else ()
    # Neither needs Redis: they never wait behind the dashboard's requests, which may; each has
    # workers of its own, so a client asking for /metrics again and again never delays a probe.
    # At the connection cap a queued /metrics request is shed as a page's is; a probe's never.
    return serve_app(
        app, listen, "metrics", hosts, apart=("/healthz", "/metrics"), kept=("/healthz",)
    )
