"""The HTTP server the metrics, /healthz and the dashboard are served by (``serve_app``).

waitress: one thread reads every connection (a request reaches a worker thread only once it
has arrived whole, and a connection's next request only once the answer is written), a few
workers answer. Bounded on every side, so clients that connect and stall, or send and read
nothing, can neither take the daemon's descriptors (its handlers need them) nor keep the
page, /metrics and /healthz from answering. The paths an app answers without Redis (``apart``:
/healthz and /metrics, a liveness probe's and a scraper's) have workers of their own, each path
its own (``PROBE_WORKERS``), so they never wait behind the dashboard's requests (each may wait
for Redis up to its socket timeout), nor one behind the other (a client asking for /metrics
again and again kept /healthz waiting seconds when they shared workers). Every request must
name this server in its Host header (``host_allowed``: DNS rebinding), else it gets 421. What
is served, and behind which token, is the app's business (``endpoint.serve``, ``Dashboard``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import re
import select
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from waitress import wasyncore
from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.server import TcpWSGIServer
from waitress.task import ThreadedTaskDispatcher

WSGIApp = Callable[..., Any]

MAX_CONNECTIONS = 64  # open at once; at the cap, a new one closes the one waiting longest
# Seconds a new connection that had sent nothing when taken has for its request to begin before
# the cap counts it as waiting; at the cap, the oldest such one is closed when nothing else can go.
NEW_GRACE = 0.5
# Seconds for a request to arrive whole, for a connection to sit idle, and for an answer the
# client reads nothing of.
TIMEOUT = 10
WORKERS = 4  # requests answered at once
PROBE_WORKERS = 2  # requests of each path ``apart`` answered at once, besides WORKERS
MAX_HEADERS = 32 * 1024  # bytes of a request's line and headers
MAX_BODY = 64 * 1024  # bytes of a request's body (the dashboard's actions are small)
# Bytes of an answer waiting unsent past which a worker writing more waits for the client (the
# answers here are written in one piece, so a worker never waits: a bound all the same).
OUTBUF_HIGH = 256 * 1024
RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close with a reset
# A Host header: a name or IPv4 address, or an [IPv6] address, and an optional port.
HOST = re.compile(r"(?:\[(?P<ip6>[0-9a-f:.]+)\]|(?P<name>[a-z0-9_.-]+))(?::[0-9]{1,5})?")
MISDIRECTED = orjson.dumps(
    {"error": "misdirected request: this server does not answer that Host name "
              "(names it answers: its listen address, localhost, dashboard.allowed_hosts)"}
)  # fmt: skip


class Server:
    """A server running on a daemon thread: its address, and a way to stop it."""

    def __init__(self, server: _WSGIServer, thread: threading.Thread) -> None:
        self._server, self._thread = server, thread

    @property
    def server_address(self) -> tuple[str, int]:
        return self._server.effective_host, int(self._server.effective_port)

    def shutdown(self) -> None:
        """Let the workers finish (they wake the loop through its trigger when done), then
        close every connection and the listening socket from the server's own thread."""
        self._server.task_dispatcher.shutdown(timeout=TIMEOUT)
        for probes in self._server.probes.values():
            probes.shutdown(timeout=TIMEOUT)
        self._server.trigger.pull_trigger(lambda: wasyncore.close_all(self._server._map))
        self._thread.join(TIMEOUT)


def serve_app(
    app: WSGIApp,
    listen: str,
    name: str,
    allowed_hosts: Iterable[str] | None = None,
    apart: Iterable[str] = (),
    kept: Iterable[str] | None = None,
) -> Server:
    """Serve ``app`` on ``listen`` (HOST:PORT) from a daemon thread, answering only the Host
    names ``host_allowed`` lets through (``allowed_hosts``: by default the app's own). The
    requests for each path of ``apart`` (ones answered without Redis) go to workers of its own.
    At the cap, a request waiting for its workers is shed for a newcomer unless its path is one
    of ``kept`` (a liveness probe's; by default every path of ``apart``)."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if allowed_hosts is None:
        allowed_hosts = getattr(app, "allowed_hosts", ())
    names = host_names(host, allowed_hosts)
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)  # "queue depth" on every burst
    apart = frozenset(apart)
    kept = apart if kept is None else frozenset(kept)
    server = _WSGIServer(host_check(app, names), _socket_info(host, int(port)), apart, kept)
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    return Server(server, thread)


def host_names(listen_host: str, allowed: Iterable[str]) -> frozenset[str]:
    """The names a request's Host may carry: localhost, the listen host, and ``allowed``."""
    return frozenset(n.strip().lower().rstrip(".") for n in ("localhost", listen_host, *allowed))


def host_allowed(header: str, names: frozenset[str]) -> bool:
    """Whether to answer a request whose Host header is ``header``. A browser sends the name
    it resolved, so a page of another site whose name was made to resolve to this address
    (DNS rebinding) carries that name, and is refused. An IP address (any port) or no Host
    at all cannot be such a name: the page's origin would then be this server itself."""
    if not header:
        return True
    match = HOST.fullmatch(header.strip().lower())
    if match is None:
        return False
    name = match["ip6"] or match["name"].rstrip(".")
    return name in names or _is_ip(name)


def host_check(app: WSGIApp, names: frozenset[str]) -> WSGIApp:
    """``app``, answering 421 Misdirected Request to a Host not in ``names``."""

    def checked(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if host_allowed(environ.get("HTTP_HOST", ""), names):
            return app(environ, start_response)
        headers = [("Content-Type", "application/json"), ("X-Content-Type-Options", "nosniff")]
        start_response("421 Misdirected Request", [*headers, ("Cache-Control", "no-store")])
        return [MISDIRECTED]

    return checked


def app_path(path: str | None) -> str | None:
    """The path the app answers a request for (its PATH_INFO): waitress's parsed path with its
    leading slashes squeezed to one (``//healthz`` is answered as /healthz)."""
    if path is None or not path.startswith("/"):
        return path
    return "/" + path.lstrip("/")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _socket_info(host: str, port: int) -> tuple[int, int, int, Any]:
    """What waitress binds: IPv6 for an address with a colon, else IPv4 (empty: all)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    kind = socket.SOCK_STREAM
    found = socket.getaddrinfo(host or None, port, family, kind, 0, socket.AI_PASSIVE)
    return family, kind, found[0][2], found[0][4]


class _Channel(HTTPChannel):
    """A connection of one request at a time, knowing since when it has waited. waitress
    parses every request in what it reads at once: one 8 KiB read of pipelined requests queued
    hundreds of answers, and a client reading none kept a worker writing until 16 MiB waited
    unsent. Here the bytes past the first whole request are held back (``held``), parsed once
    its answer is written (``readable``): a connection costs one answer at most."""

    began = 0.0  # when the request now arriving began (0: none has yet)
    held = b""  # bytes past the request being answered, parsed once its answer is written

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.born = time.time()
        super().__init__(*args, **kwargs)
        self.read_now()

    def read_now(self) -> None:
        """Read what the client sent before it was taken (a probe's request, as a rule), so
        that at the cap a request already sent is known at once and never shed as new."""
        poller = select.poll()
        poller.register(self._fileno, select.POLLIN)
        if poller.poll(0):
            self.handle_read()  # waitress's read: a client gone or a socket error closes it

    def fresh(self, now: float) -> bool:
        """Just accepted, nothing of a request read yet (``read_now``, nor since): at the cap,
        closed for another before NEW_GRACE has passed only when no other can go."""
        return not self.began and now - self.born < NEW_GRACE

    def received(self, data: bytes) -> bool:
        """Parse ``data`` up to the end of the first whole request; hold back the rest."""
        if not data:
            return False
        with self.requests_lock:
            if self.will_close or self.close_when_flushed:
                return False
            while data and not self.requests:
                data = self._parse(data)
            self.held = data
        return True

    def _parse(self, data: bytes) -> bytes:
        """Feed ``data`` to the request arriving (queueing it once whole, as waitress does);
        returns the bytes past its end."""
        if self.request is None:
            self.request = self.parser_class(self.adj)
            self.began = time.time()
        request = self.request
        used = request.received(data)
        if request.expect_continue and request.headers_finished and not self.sent_continue:
            self.send_continue()
        if request.completed:
            self.sent_continue = False
            self.request = None
            if not request.empty:
                self.requests.append(request)
                self.server.add_task(self)
        return data[used:]

    def readable(self) -> bool:
        """waitress reads once the answers are written; the bytes held back go first."""
        if not super().readable():
            return False
        if self.held:
            self.received(self.held)
            return bool(super().readable())
        return True

    def take_sent(self) -> bool:
        """Before it is closed at the cap: parse what was held back and read what the client
        sent (its next request, sent while it was idle, maybe in this very turn of the loop).
        True when it read or parsed anything: pick again, a request may now be under way."""
        if not HTTPChannel.readable(self):  # an answer being made or unsent: nothing to read
            return False
        before = (self.connected, self.last_activity, self.began, len(self.requests), self.held)
        if self.held:
            self.received(self.held)
        if not self.requests:
            self.read_now()
            self.server.read_early.add(self)  # this turn's read event, if any, is stale now
        after = (self.connected, self.last_activity, self.began, len(self.requests), self.held)
        return after != before  # or it closed: gone, no need to close it

    def handle_read(self) -> None:
        """waitress's read, but for a stale read event (``take_sent`` read it already): the
        read would find nothing, and waitress closes a connection whose read fails."""
        if self not in self.server.read_early:
            super().handle_read()

    def write_soon(self, data: Any) -> int:
        self.last_activity = time.time()  # an answer handed to be sent: waiting from now on
        return int(super().write_soon(data))

    def sending(self, now: float, since: float) -> bool:
        """An answer being sent as the client reads it (within NEW_GRACE): not waiting (a
        scrape's answer was closed mid-send as the only connection that was not queued)."""
        return bool(self.total_outbufs_len) and now - since < NEW_GRACE

    def waiting_since(self) -> float | None:
        """None while a worker answers a request and nothing of the answer waits to be sent;
        else when the request still arriving began, or the last byte received, sent, or
        handed to be sent by a worker (``write_soon``: an answer unread counts from then)."""
        if self.requests and not self.total_outbufs_len:
            return None
        if self.request is not None:
            return self.began
        return self.last_activity


class _WSGIServer(TcpWSGIServer):
    """waitress's server, with a request timeout and a cap on connections that never stops
    accepting while a connection merely waits: at the cap, the one waiting longest is closed
    for the newcomer (``_victim``), and when none waits, one whose request waits for the page's
    workers, or for a busy path's (/metrics; never a probe's: ``kept``), not the next in line
    (``_shed_first``). Only when every connection has a request being answered, or queued for
    the probes' workers, do new ones wait in the listen backlog; a new connection's bytes are
    read as it is taken (``_Channel.read_now``), and one that had sent nothing is closed,
    oldest first, only when nothing else can go. A request for a path ``apart`` is answered by
    that path's own workers (``probes``), never waiting behind the others. Before a connection
    idle between two requests is closed, what it sent is read (``_Channel.take_sent``): a
    kept-alive scrape's next request arriving with a newcomer was closed unread."""

    channel_class = _Channel

    def __init__(
        self,
        app: WSGIApp,
        sockinfo: tuple[int, int, int, Any],
        apart: frozenset[str],
        kept: frozenset[str],
    ) -> None:
        adj = Adjustments(
            threads=WORKERS, connection_limit=MAX_CONNECTIONS, channel_timeout=TIMEOUT,
            cleanup_interval=1, max_request_header_size=MAX_HEADERS,
            max_request_body_size=MAX_BODY, outbuf_high_watermark=OUTBUF_HIGH,
            asyncore_use_poll=True, ident="jobd", log_socket_errors=False,
        )  # fmt: skip
        self.closing: set[_Channel] = set()
        self.read_early: set[_Channel] = set()  # read this turn before their read event
        self.probes = {path: ThreadedTaskDispatcher() for path in apart}
        for probes in self.probes.values():
            probes.set_thread_count(PROBE_WORKERS)
        # Besides the page's, the workers whose queued requests the cap may shed (not a probe's)
        self.sheddable = [p for path, p in self.probes.items() if path not in kept]
        super().__init__(app, map={}, adj=adj, sockinfo=sockinfo)

    def add_task(self, task: Any) -> None:
        """A connection's one request (``_Channel``) to its path's workers, or the others'."""
        request = task.requests[0] if task.requests else None
        path = app_path(getattr(request, "path", None))
        probes = self.probes.get(path) if path else None
        if probes is None or request.error:
            probes = self.task_dispatcher
        probes.add_task(task)

    def run(self) -> None:
        """waitress's loop, closing the connections picked to go between two turns (one whose
        client reads nothing never turns writable: ``will_close`` alone would leave it open)."""
        while self._map:
            wasyncore.poll2(self.adj.asyncore_loop_timeout, self._map)
            self.read_early.clear()
            while self.closing:
                self.closing.pop().handle_close()

    def readable(self) -> bool:
        now = time.time()
        if now >= self.next_channel_cleanup:
            self.next_channel_cleanup = now + self.adj.cleanup_interval
            self.maintenance(now)
        if not self.accepting:
            return False
        return self._open() < MAX_CONNECTIONS or self._victim(now, take=False) is not None

    def handle_accept(self) -> None:
        """Take a new connection; past the cap, close another for it (``_victim``)."""
        super().handle_accept()
        looked: set[_Channel] = set()  # read before closing, once each (a request never shed)
        while self._open() > MAX_CONNECTIONS:
            victim = self._victim(time.time(), take=True)
            if victim is None:
                break
            if victim not in looked:
                looked.add(victim)
                if victim.take_sent():
                    continue
            self._close(victim)

    def maintenance(self, now: float) -> None:
        """Close every connection that has waited longer than TIMEOUT."""
        for channel in list(self.active_channels.values()):
            since = channel.waiting_since()
            if since is not None and since < now - TIMEOUT:
                self._close(channel)

    def _open(self) -> int:
        return sum(c not in self.closing for c in self.active_channels.values())

    def _victim(self, now: float, take: bool) -> _Channel | None:
        """The connection to close for a newcomer at the cap: the one waiting longest (its
        request arriving, idle, or its answer unread), a new one only once past NEW_GRACE;
        else one whose request waits for the page's workers, then for those of a path apart
        not ``kept`` (``_shed_first``; taken off their queue when ``take``); else the oldest
        new one (it had sent nothing, ``read_now``). None: every one is being answered, or
        queued for the probes' workers."""
        channels = [c for c in self.active_channels.values() if c not in self.closing]
        waiting = [(since, c) for c in channels if not c.fresh(now) and (since :=
                   c.waiting_since()) is not None and not c.sending(now, since)]  # fmt: skip
        if waiting:
            return min(waiting, key=lambda pair: pair[0])[1]
        for workers in (self.task_dispatcher, *self.sheddable):
            with workers.lock:
                if (queued := self._shed_first(workers.queue)) is not None and take:
                    workers.queue.remove(queued)
            if queued is not None:
                return queued
        new = [c for c in channels if c.fresh(now)]
        return min(new, key=lambda c: c.born) if new else None

    def _shed_first(self, queued: Iterable[_Channel]) -> _Channel | None:
        """Of the connections queued (oldest first), the one to shed: one that pipelined more
        requests (``held``: a scraper never does), then one of the address with the most
        connections, then the newest: not the next in line (a client reconnecting as fast as
        it was shed then closed every scrape unanswered)."""
        hosts = Counter(c.addr[0] for c in self.active_channels.values())
        ranked = [(bool(c.held), hosts[c.addr[0]], i, c) for i, c in enumerate(queued)]
        return max((r for r in ranked if r[3] not in self.closing), default=(None,) * 4)[3]

    def _close(self, channel: _Channel) -> None:
        """Close ``channel`` after this turn of the loop; it reads nothing more meanwhile.
        One with an answer unsent is reset: a graceful close would leave the answer and the
        connection to the kernel for as long as the client keeps reading nothing."""
        channel.will_close = True
        self.closing.add(channel)
        if channel.total_outbufs_len:
            with contextlib.suppress(OSError):
                channel.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)
