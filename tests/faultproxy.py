"""A fault-injecting TCP proxy for tests: put it between daemons and Redis, then break the link.

    with FaultProxy(redis_port) as proxy:       # listens on 127.0.0.1:proxy.port
        config = f"redis: {{url: '{proxy.url}'}}"
        proxy.latency(0.05)                      # every chunk forwarded 50 ms late
        proxy.cut(after_reply_bytes=3)           # each open connection: its next server reply
                                                 # is cut after 3 bytes (RST)
        proxy.blackhole(2.5)                     # 2.5 s of silence: nothing forwarded, new
                                                 # connections accepted and held
        proxy.refuse()                           # new connections refused (ECONNREFUSED)
        proxy.hold_reply(b"job7", to=b"EVAL")    # the first reply with b"job7" to a script
        proxy.holding()                          # connections whose replies are held now
        proxy.release()                          # held replies go on
        proxy.restore()                          # all faults off, listening again
        proxy.requests(b"XREADGROUP", since)     # round trips of each connection that reads

Loopback only. One thread accepts; each connection has one thread that owns both of its
sockets (so a socket is only ever closed by the thread that polls it) and forwards chunks in
order in both directions. Every method may be called from any thread; a fault applies within
``TICK`` seconds. Nothing here retries or buffers beyond what one connection has read.

What each fault looks like to the client:
- latency: replies come late; nothing is lost.
- cut(reset=True): ECONNRESET (the proxy closes with SO_LINGER 0 on both sides: Redis sees
  the client vanish); cut(reset=False): EOF ("Connection closed by server").
- cut(after_reply_bytes=N): the connection survives until the server next sends something;
  then at most N bytes of that chunk reach the client, always at least one byte short of the
  whole chunk, so the reply is incomplete; then the cut. The request was executed by Redis:
  the classic "did my write happen?" case.
- blackhole: a network partition. Data is not read, so nothing is lost: when the blackhole
  ends, what was sent meanwhile is delivered (as TCP would after retransmits). New connections
  complete their handshake (the kernel accepts) but reach Redis only when it ends.
- refuse: the listening socket is closed; open connections are untouched (combine with cut()
  for "Redis is down").
- hold_reply: one reply late, as long as the test wants: the request was executed by Redis (a
  read delivered the job), but its reply, and all that follows on that connection, waits in
  the proxy until ``release`` (or ``restore``). Other connections and requests go on. The
  marker is looked for in each chunk the server sends (a small reply is one chunk), the
  request in the first bytes of what the client sent last. So a test can hold the reply of a
  read that delivered a given job, then stop or cut off the client before it sees it.
"""

from __future__ import annotations

import contextlib
import fcntl
import select
import socket
import struct
import termios
import threading
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType

CHUNK = 65536
TICK = 0.01  # seconds: how often an idle thread looks at the fault settings
SEND_TIMEOUT = 10.0  # a peer that stops reading for this long: the connection is dropped
DRAIN_TIMEOUT = 0.5  # before a reset, wait this long at most for sent bytes to leave


class ProxyError(Exception):
    pass


class _Connection:
    """One client connection: its state is set by the test thread, acted on by its own thread."""

    def __init__(self, client: socket.socket) -> None:
        self.client = client
        self.upstream: socket.socket | None = None
        self.kill: bool | None = None  # set: cut now; the value says whether with RST
        self.cut_after: int | None = None  # armed mid-reply cut: bytes to let through
        self.cut_reset = True
        self.closed = threading.Event()
        # (when, first bytes) of each request: what the client sent after a reply (or first),
        # however many chunks TCP cut it into; so one per round trip (a pipeline is one)
        self.requests: list[tuple[float, bytes]] = []
        self.replied = True  # the server spoke last: the client's next chunk starts a request
        self.holding = False  # replies are held (hold_reply matched here), until release()


def _drain(sock: socket.socket, timeout: float) -> None:
    """Wait until what was sent on ``sock`` has left its send queue (SIOCOUTQ), so that a
    reset right after does not discard it; bounded by ``timeout``."""
    end = time.monotonic() + timeout
    buf = bytearray(4)
    while time.monotonic() < end:
        try:
            fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, buf)
        except OSError:
            return
        if struct.unpack("i", buf)[0] == 0:
            return
        time.sleep(0.001)


def _close(sock: socket.socket | None, reset: bool) -> None:
    if sock is None:
        return
    with contextlib.suppress(OSError):
        if reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            sock.shutdown(socket.SHUT_RDWR)
    sock.close()


class FaultProxy:
    """A TCP proxy from 127.0.0.1:``port`` to ``upstream_host``:``upstream_port`` whose link
    a test can slow down, cut, silence or refuse (see the module's docstring)."""

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self._lock = threading.Lock()
        self._conns: set[_Connection] = set()
        self._threads: list[threading.Thread] = []
        self._latency = 0.0
        self._hold_until = 0.0  # monotonic time a blackhole ends
        self._hold_forever = False
        self._refusing = False
        self._hold: tuple[bytes, bytes] | None = None  # armed hold_reply: (marker, request)
        self._listening = threading.Event()
        self._not_listening = threading.Event()
        self._closing = threading.Event()
        self._listener: socket.socket | None = self._listen(0)
        self.port: int = self._listener.getsockname()[1]
        self.accepted = 0  # connections accepted so far
        self.cuts = 0  # connections cut by a fault so far

    # -- the test's side -------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> FaultProxy:
        self._spawn(self._accept_loop, "faultproxy-accept")
        return self

    def close(self) -> None:
        """Stop accepting, close every connection (FIN), and wait for the threads (bounded)."""
        self._closing.set()
        for conn in self._snapshot():
            self._request_kill(conn, reset=False)
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def latency(self, seconds: float) -> None:
        """Forward every chunk (each direction, order kept) ``seconds`` after it was read."""
        with self._lock:
            self._latency = max(0.0, seconds)

    def cut(self, *, reset: bool = True, after_reply_bytes: int | None = None) -> int:
        """Cut every open connection: now (and return once they are closed), or, with
        ``after_reply_bytes``, in the middle of each one's next server reply. New connections
        are not affected. Returns how many connections were cut or armed."""
        conns = self._snapshot()
        if after_reply_bytes is None:
            for conn in conns:
                self._request_kill(conn, reset)
            for conn in conns:
                conn.closed.wait(5)
        else:
            with self._lock:
                for conn in conns:
                    conn.cut_after, conn.cut_reset = max(0, after_reply_bytes), reset
        return len(conns)

    def armed(self) -> int:
        """Connections still waiting for a reply to be cut in (see ``cut``)."""
        with self._lock:
            return sum(1 for c in self._conns if c.cut_after is not None)

    def blackhole(self, seconds: float | None) -> None:
        """Forward nothing, either way, for ``seconds`` (None: until ``restore``); connections
        made meanwhile are accepted and held."""
        with self._lock:
            if seconds is None:
                self._hold_forever = True
            else:
                self._hold_until = time.monotonic() + seconds

    def blackholed(self) -> bool:
        with self._lock:
            return self._held()

    def hold_reply(self, containing: bytes, to: bytes) -> None:
        """Hold the first server reply that contains ``containing`` to a request that contains
        ``to`` (in its first 200 bytes), and everything after it on its connection, until
        ``release``; Redis has executed that request. One reply: the hold disarms when it
        matches."""
        with self._lock:
            self._hold = (containing, to)

    def holding(self) -> int:
        """Connections whose replies are held now (see ``hold_reply``)."""
        with self._lock:
            return sum(1 for c in self._conns if c.holding)

    def release(self) -> None:
        """Held replies go on (as far as other faults let them); an armed hold is disarmed."""
        with self._lock:
            self._hold = None
            for conn in self._conns:
                conn.holding = False

    def refuse(self) -> None:
        """Refuse new connections (the listening socket is closed); returns once it is."""
        with self._lock:
            self._refusing = True
            self._not_listening.clear()
        if not self._not_listening.wait(5):
            raise ProxyError("the proxy did not stop listening")

    def restore(self) -> None:
        """Every fault off: no latency, no blackhole, no armed cut, listening again on the same
        port (returns once it is); held replies go on."""
        with self._lock:
            self._latency, self._hold_until, self._hold_forever = 0.0, 0.0, False
            self._refusing = False
            self._hold = None
            self._listening.clear()
            for conn in self._conns:
                conn.cut_after = None
                conn.holding = False
        if not self._listening.wait(5):
            raise ProxyError(f"the proxy could not listen on port {self.port} again")

    def connections(self) -> int:
        with self._lock:
            return len(self._conns)

    # -- threads ---------------------------------------------------------------------------

    def requests(self, containing: bytes, since: float) -> list[int]:
        """For each connection that ever sent a request containing ``containing`` (in its first
        200 bytes): how many requests it sent after ``since`` (time.monotonic()), that is,
        round trips (a pipeline is one)."""
        return [
            sum(1 for at, _ in conn.requests if at > since)
            for conn in self._snapshot()
            if any(containing in head for _, head in conn.requests)
        ]

    def _spawn(self, target: Callable[..., object], name: str, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _snapshot(self) -> list[_Connection]:
        with self._lock:
            return list(self._conns)

    def _request_kill(self, conn: _Connection, reset: bool) -> None:
        with self._lock:
            if conn.kill is None:
                conn.kill = reset

    def _held(self) -> bool:
        return self._hold_forever or time.monotonic() < self._hold_until

    def _listen(self, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
        return sock

    def _accept_loop(self) -> None:
        while not self._closing.is_set():
            with self._lock:
                refusing = self._refusing
            if refusing:
                if self._listener is not None:
                    self._listener.close()
                    self._listener = None
                self._listening.clear()
                self._not_listening.set()
                time.sleep(TICK)
                continue
            if self._listener is None:
                try:
                    self._listener = self._listen(self.port)
                except OSError:
                    time.sleep(TICK)  # restore() gives up after 5 s and says so
                    continue
            self._not_listening.clear()
            self._listening.set()
            readable, _, _ = select.select([self._listener], [], [], TICK)
            if not readable:
                continue
            try:
                client, _ = self._listener.accept()
            except OSError:
                continue
            conn = _Connection(client)
            with self._lock:
                self._conns.add(conn)
                self.accepted += 1
            self._spawn(self._serve, "faultproxy-conn", conn)
        if self._listener is not None:
            self._listener.close()

    def _serve(self, conn: _Connection) -> None:
        reset = False
        try:
            reset = self._forward(conn)
        except OSError:
            reset = True  # a peer reset or timed out: pass that on to the other side
        finally:
            _close(conn.client, reset)
            _close(conn.upstream, reset)
            with self._lock:
                self._conns.discard(conn)
            conn.closed.set()

    def _killed(self, conn: _Connection) -> bool | None:
        """Whether to cut ``conn`` now, and how (True: RST, False: FIN); None: not now."""
        if self._closing.is_set():
            return False
        with self._lock:
            if conn.kill is not None:
                self.cuts += 1
            return conn.kill

    def _forward(self, conn: _Connection) -> bool:
        """Forward until a side closes or a fault cuts; returns whether to close with RST."""
        while True:  # a connection made during a blackhole reaches Redis when it ends
            if (kill := self._killed(conn)) is not None:
                return kill
            with self._lock:
                held = self._held()
            if not held:
                break
            time.sleep(TICK)
        conn.upstream = socket.create_connection(self.upstream, timeout=5)
        for sock in (conn.client, conn.upstream):
            sock.settimeout(SEND_TIMEOUT)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        to_server: deque[tuple[float, bytes]] = deque()
        to_client: deque[tuple[float, bytes]] = deque()
        while True:
            if (kill := self._killed(conn)) is not None:
                return kill
            with self._lock:
                held = self._held()
                replying = not conn.holding
            if held:
                time.sleep(TICK)
                continue
            now = time.monotonic()
            while to_server and to_server[0][0] <= now:
                conn.upstream.sendall(to_server.popleft()[1])
            while replying and to_client and to_client[0][0] <= now:
                if self._send_reply(conn, to_client.popleft()[1]):
                    return conn.cut_reset
            due = [q[0][0] for q in (to_server, to_client if replying else ()) if q]
            wait = min([TICK, *(max(0.0, d - now) for d in due)])
            readable, _, _ = select.select([conn.client, conn.upstream], [], [], wait)
            for sock in readable:
                data = sock.recv(CHUNK)
                if not data:  # one side closed: close the other too, after what is queued
                    other, queued = (
                        (conn.client, to_client)
                        if sock is conn.upstream
                        else (conn.upstream, to_server)
                    )
                    for _, chunk in queued:
                        other.sendall(chunk)
                    return False
                queue = to_server if sock is conn.client else to_client
                if sock is conn.client and conn.replied:
                    conn.requests.append((time.monotonic(), data[:200]))
                conn.replied = sock is conn.upstream
                with self._lock:  # read now: the setting may have changed while we waited
                    latency = self._latency
                    if sock is conn.upstream and self._matches(conn, data):
                        conn.holding, self._hold = True, None
                # order is kept: a chunk is never due before the one read before it
                due_at = max(time.monotonic() + latency, queue[-1][0] if queue else 0.0)
                queue.append((due_at, data))

    def _matches(self, conn: _Connection, reply: bytes) -> bool:
        """Whether ``reply`` (a server chunk) is the one an armed hold_reply waits for (the lock
        held)."""
        if self._hold is None or not conn.requests:
            return False
        containing, to = self._hold
        return containing in reply and to in conn.requests[-1][1]

    def _send_reply(self, conn: _Connection, chunk: bytes) -> bool:
        """Send a server chunk to the client; True when an armed mid-reply cut fired."""
        with self._lock:
            after = conn.cut_after
            if after is not None:
                conn.cut_after = None
                self.cuts += 1
        if after is None:
            conn.client.sendall(chunk)
            return False
        part = chunk[: min(after, len(chunk) - 1)]
        if part:
            conn.client.sendall(part)
            _drain(conn.client, DRAIN_TIMEOUT)
        return True
