"""Waiting for a stream entry without reading it: XREAD BLOCK, its reply skipped as it comes.

XREAD BLOCK is the one way to wait for a stream's next entry, and its reply is that entry,
whatever its size: a producer's 256 MiB entry, parsed by redis-py, took the daemon to 1 GB
before any check could refuse it. Here the command goes out on a connection of the client's own
pool and its reply is read straight from the socket, 64 KiB at a time, kept only as far as its
first line (a null reply: the wait timed out; anything else: an entry came) and skipped to its
end, so the connection stays in step and goes back to the pool. Memory: one 64 KiB buffer.
The entry itself is then read by a script that bounds it (``reading``, lua/lib/jobs.lua sized).

Any failure on the way (a timeout, a connection cut mid-reply, a reply that is not RESP) drops
the connection, as redis-py does: its next user connects again.

While the streams' cluster slot migrates, an ASK is followed (the same wait, after ASKING, on
the node it names), streams split between the two nodes (TRYAGAIN) are polled every SPLIT_WAIT,
and a pause or generation the node sent elsewhere is read by the cluster client (``wait``).

A wait can be cut short from another thread (``Bell.cut``: a daemon stopping ends its readers'
waits at once, not after up to a BLOCK of a second): the waiting connection's socket is shut, the
waiter gets a connection error. Only a wait is ever cut: XREAD delivers nothing to a group, so a
cut loses no entry, and a bell is held only from the moment its connection is taken to the moment
its reply was read; once cut, no later wait of it is sent.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import redis
from redis.cluster import RedisCluster

from jobd.store.connection import away, node_for

CHUNK = 65536  # bytes read from the socket at a time, and the longest line taken
# Errors that say "not here, not now" (a cluster's redirection, a server loading or without its
# master): Redis being away, for the caller (it connects again and refreshes its view).
_AWAY = ("MOVED ", "ASK ", "CLUSTERDOWN ", "TRYAGAIN ", "LOADING ", "MASTERDOWN ")
# Seconds a wait sleeps instead of blocking when its streams (a queue's levels) are split
# between two nodes, mid-migration (TRYAGAIN): then it says an entry came, and the reader
# reads, key by key. No XREAD can wait on them until they are on one node again.
SPLIT_WAIT = 0.2


class Bell:
    """The wait under way on one thread's connection, for another thread to ``cut``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.waiting: Any = None  # the connection of the wait under way
        self.was_cut = False

    @contextlib.contextmanager
    def held(self, conn: Any) -> Iterator[None]:
        with self.lock:
            if self.was_cut:
                raise redis.ConnectionError("the wait was cut: stopping")
            self.waiting = conn
        try:
            yield
        finally:
            with self.lock:
                self.waiting = None

    def cut(self) -> None:
        """End the wait under way, if one is (its socket shut: its reply never comes), and every
        later one before it is sent."""
        with self.lock:
            self.was_cut = True
            sock = getattr(self.waiting, "_sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


Address = tuple[str, int]  # an ASK's node: the slot migrates there, and the streams are there
Came = bool | Address | None  # None: TRYAGAIN, the streams split between two nodes


def wait(
    client: redis.Redis | RedisCluster,
    newest: dict[str, str],
    block_ms: int,
    then: str | None,
    gen: str | None = None,
    bell: Bell | None = None,
) -> tuple[bool, dict[bytes, bytes] | Exception | None, bytes | None]:
    """Wait up to ``block_ms`` until a stream of ``newest`` has an entry after its id (the
    streams share one cluster slot); True when one has. With ``then`` (a hash in that slot:
    the queue's pause), its HGETALL in the same round trip, after the wait: the hash, or the
    error Redis answered (None without ``then``); with ``gen`` (a string there: the queue's
    cancel generation), its GET too (None when there is none or it is not a short string).

    While the slot migrates (Redis Cluster resharding), the node asked answers ASK for keys it
    no longer has: for the streams, the wait is sent to the node the ASK names (ASKING, then
    the XREAD, its reply skipped all the same); for the pause or the generation, they are
    read again, after the wait, by the cluster client, which follows ASK itself. With ``bell``,
    another thread can cut the wait short (``Bell.cut``)."""
    bell = Bell() if bell is None else bell
    node = node_for(client, next(iter(newest)))
    came, pause, value = _send(node, newest, block_ms, then, gen, bell)
    asked = isinstance(came, tuple)
    if isinstance(came, tuple):  # the slot migrates, and the streams are on the node named
        came = _send(_node_at(client, came), newest, block_ms, None, None, bell, asking=True)[0]
        if isinstance(came, tuple):
            raise redis.ConnectionError(f"ASK again from the node asked: {came}")
    if came is None:
        time.sleep(min(SPLIT_WAIT, block_ms / 1000))
        came = True
    if then is not None and (asked or _elsewhere(pause)):
        pause = _hgetall(client, then)
    if gen is not None and (asked or _elsewhere(value)):
        value = _get(client, gen)
    return came, pause, value if isinstance(value, bytes) else None


def _send(
    node: redis.Redis,
    newest: dict[str, str],
    block_ms: int,
    then: str | None,
    gen: str | None,
    bell: Bell,
    asking: bool = False,
) -> tuple[Came, dict[bytes, bytes] | Exception | None, bytes | Exception | None]:
    """XREAD BLOCK on ``node`` (after ASKING, with ``asking``), and HGETALL ``then`` and GET
    ``gen`` when given, in one round trip on a connection of its pool: whether an entry came
    (or where the ASK sends it, or None for TRYAGAIN), the hash and the string, or their
    errors. Any failure on the way drops the connection; ``bell`` holds it meanwhile."""
    pool = node.connection_pool
    conn = pool.get_connection()
    try:
        with bell.held(conn):
            return _exchange(conn, newest, block_ms, then, gen, asking)
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


def _exchange(
    conn: Any,
    newest: dict[str, str],
    block_ms: int,
    then: str | None,
    gen: str | None,
    asking: bool,
) -> tuple[Came, dict[bytes, bytes] | Exception | None, bytes | Exception | None]:
    """``_send``'s round trip on ``conn``."""
    commands: list[tuple[object, ...]] = [("ASKING",)] if asking else []
    commands.append(("XREAD", "COUNT", 1, "BLOCK", block_ms, "STREAMS", *newest, *newest.values()))
    if then is not None:
        commands.append(("HGETALL", then))
    if gen is not None:
        commands.append(("GET", gen))
    conn.send_packed_command(conn.pack_commands(commands))
    reply = _Reply(conn)
    if asking and (line := reply.first()) != b"+OK":
        raise redis.ConnectionError(f"ASKING answered {line[:80]!r}")
    came = _came(reply)
    pause = None if then is None else reply.hash()
    return came, pause, None if gen is None else reply.string()


def _came(reply: _Reply) -> Came:
    """Whether the reply says an entry came, or the node an ASK names, or None for TRYAGAIN
    (the slot migrates, and the streams are split between its two nodes); the reply read to
    its end."""
    line = reply.first()
    kind, rest = line[:1], line[1:]
    if kind == b"-":
        text = rest.decode("utf-8", "replace")
        if text.startswith("ASK "):  # ASK SLOT HOST:PORT (no host: the node asked)
            host, _, port = text.split()[-1].rpartition(":")
            return (host or reply.host, int(port))
        if text.startswith("TRYAGAIN "):
            return None
        if text.startswith(_AWAY):
            raise redis.ConnectionError(text)
        raise redis.ResponseError(text)
    if kind == b"_" or (kind in (b"*", b"%") and int(rest) < 0):
        return False  # null: nothing came within the block
    reply.skip_value(line)
    return True


def _node_at(client: redis.Redis | RedisCluster, address: Address) -> redis.Redis:
    """The plain client of the node an ASK names (one the cluster client knows)."""
    node = None
    if isinstance(client, RedisCluster):
        node = client.get_node(*client.nodes_manager.remap_host_port(*address))
    if node is None:  # a node added since the client last asked: like Redis away, for now
        raise redis.ConnectionError(f"ASK to a node this client does not know: {address}")
    return client.get_redis_connection(node)


def _elsewhere(reply: object) -> bool:
    """Whether a reply is an error that says "not here, not now" (an ASK, mostly)."""
    return isinstance(reply, redis.ResponseError) and str(reply).startswith(_AWAY)


def _hgetall(client: redis.Redis | RedisCluster, key: str) -> dict[bytes, bytes] | Exception:
    """HGETALL by the client itself (following ASK): the hash, or the error it is (Redis
    being away is raised)."""
    try:
        return client.hgetall(key)  # type: ignore[return-value]
    except redis.ResponseError as exc:
        if away(exc):
            raise
        return exc


def _get(client: redis.Redis | RedisCluster, key: str) -> bytes | None:
    """GET by the client itself (following ASK): a short string, else None (Redis being away
    is raised)."""
    try:
        value = client.get(key)
    except redis.ResponseError as exc:
        if away(exc):
            raise
        return None
    return value if isinstance(value, bytes) and len(value) <= CHUNK else None


class _Reply:
    """One RESP reply on a connection's socket, read in CHUNK pieces; what is skipped is not
    kept."""

    def __init__(self, conn: Any) -> None:
        self.sock = conn._sock  # redis-py's; the parser has nothing buffered (one call at a time)
        self.host: str = getattr(conn, "host", "")
        if self.sock is None:
            raise redis.ConnectionError("not connected")
        self.buf = bytearray()
        self.chunk = bytearray(CHUNK)

    def _more(self) -> int:
        n = self.sock.recv_into(self.chunk)
        if n == 0:
            raise redis.ConnectionError("Redis closed the connection mid-reply")
        return n

    def line(self) -> bytes:
        """The next line, without its CRLF."""
        while (end := self.buf.find(b"\r\n")) < 0:
            if len(self.buf) > CHUNK:
                raise redis.ConnectionError("a reply line longer than 64 KiB: not RESP")
            n = self._more()
            self.buf += self.chunk[:n]
        line = bytes(self.buf[:end])
        del self.buf[: end + 2]
        return line

    def first(self) -> bytes:
        """The first line of the next reply. Push frames (RESP3 ``>``: a client-tracking
        invalidation, a maintenance notification), which the server may send between any two
        replies, are skipped: taken for a reply, they would put every reply after them one
        command off, and the connection would go back to the pool with one left unread (the
        next command on it would read the one before's)."""
        while (line := self.line())[:1] == b">":
            self.skip_value(line)
        return line

    def skip(self, size: int) -> None:
        """Skip ``size`` bytes."""
        taken = min(size, len(self.buf))
        del self.buf[:taken]
        size -= taken
        while size > 0:
            n = self._more()
            if n > size:  # the rest belongs to what follows
                self.buf += self.chunk[size:n]
            size -= min(n, size)

    def hash(self) -> dict[bytes, bytes] | Exception:
        """A HGETALL reply of bulk strings (RESP2 array or RESP3 map), or the error it is; a
        hash larger than CHUNK is skipped and taken for an error (jobd's are a few fields)."""
        line = self.first()
        kind, rest = line[:1], line[1:]
        if kind == b"-":
            return redis.ResponseError(rest.decode("utf-8", "replace"))
        if kind not in (b"*", b"%"):
            self.skip_value(line)
            return redis.ResponseError(f"not a hash: {line[:20]!r}")
        n = max(int(rest), 0) * (2 if kind == b"%" else 1)
        values: list[bytes] = []
        for i in range(n):
            head = self.line()
            size = int(head[1:]) if head[:1] == b"$" else -1
            if size < 0 or size > CHUNK:
                self.skip_value(head)
                for _ in range(n - i - 1):
                    self.skip_value(self.line())
                return redis.ResponseError("a pause hash that is not a few short fields")
            while len(self.buf) < size + 2:
                self.buf += self.chunk[: self._more()]
            values.append(bytes(self.buf[:size]))
            del self.buf[: size + 2]
        return dict(zip(values[::2], values[1::2], strict=False))

    def string(self) -> bytes | Exception | None:
        """A GET reply: the string when it is a short one (a cancel generation), the error it
        is, else None (nil, anything longer than CHUNK), the reply read to its end."""
        line = self.first()
        if line[:1] == b"-":
            return redis.ResponseError(line[1:].decode("utf-8", "replace"))
        size = int(line[1:]) if line[:1] == b"$" else -1
        if size < 0 or size > CHUNK:
            if line[:1] != b"_":
                self.skip_value(line)
            return None
        while len(self.buf) < size + 2:
            self.buf += self.chunk[: self._more()]
        value = bytes(self.buf[:size])
        del self.buf[: size + 2]
        return value

    def skip_value(self, line: bytes) -> None:
        """Skip the value whose first line is ``line``, nested values and bulk strings too."""
        pending = 1
        while True:
            kind, rest = line[:1], line[1:]
            pending -= 1
            if kind in (b"*", b"~", b">"):  # array, set, push: n values follow
                pending += max(int(rest), 0)
            elif kind == b"%":  # map: n pairs follow
                pending += 2 * max(int(rest), 0)
            elif kind == b"|":  # attributes: n pairs, then the value they describe
                pending += 2 * max(int(rest), 0) + 1
            elif kind in (b"$", b"=", b"!"):  # bulk string, verbatim, bulk error: n bytes
                if int(rest) >= 0:
                    self.skip(int(rest) + 2)
            elif kind not in (b"+", b"-", b":", b"_", b",", b"#", b"("):
                raise redis.ConnectionError(f"not a RESP reply: {line[:20]!r}")
            if pending == 0:
                return
            line = self.line()
