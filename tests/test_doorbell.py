"""The doorbell's raw reply handling (store/doorbell.py), from the review of the bounded reads
(each test failed on 9d2400f).

jobd's connections speak RESP3 (redis-py 8's default: HELLO 3), where the server may send a push
frame (``>``: a client-tracking invalidation, a maintenance notification) at any time, outside
any reply. redis-py's parsers hand pushes aside and read on; the doorbell, reading the socket
itself, takes the push for XREAD's reply, the XREAD reply for the pause hash, HGETALL's for the
cancel generation, and returns the connection to the pool with GET's reply unread: the next
command on that connection reads the previous one's reply (wrong data), and so on. The
doorbell now skips push frames before each reply.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import redis
from support import RedisServer, wait_until


class SplittingProxy:
    """A TCP proxy that forwards the server's bytes one at a time (as a slow or lossy network,
    a TLS record boundary or a middlebox may split them), the client's at once."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            self.sockets += [client, server]
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, split: bool) -> None:
        try:
            while data := src.recv(65536):
                if not split:
                    dst.sendall(data)
                    continue
                for i in range(len(data)):
                    dst.sendall(data[i : i + 1])
                    time.sleep(0.0002)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()
        for s in self.sockets:
            s.close()


def _doorbell_connection(r: redis.Redis) -> int | None:
    """The id of the daemon's connection blocked in XREAD (the doorbell's wait)."""
    for c in r.client_list():
        if c["cmd"] == "xread" and "b" in c["flags"]:
            return int(c["id"])
    return None


def test_a_push_frame_during_the_doorbell_wait_does_not_desync_the_connection(
    r: redis.Redis, redis_server: RedisServer, tmp_path: Path, daemon
) -> None:
    """One RESP3 push on the doorbell's connection (here an invalidation another client
    redirects to it, CLIENT TRACKING … REDIRECT) must cost nothing: jobs added next all run at
    once. On 9d2400f the reader's next read_levels call gets GET's stale reply (None: "reader
    failed … TypeError: cannot unpack non-iterable NoneType object"), the reader backs off 5 s,
    and the entry that read delivered stays pending on the daemon, unrun, until reclaim_after
    (its reply went to another command)."""
    proxy = SplittingProxy(redis_server.port)
    out = tmp_path / "ran"
    config = tmp_path / "jobd.yaml"
    config.write_text(
        f"redis: {{url: 'redis://127.0.0.1:{proxy.port}'}}\n"
        "queues:\n  q:\n"
        f"    command: [sh, -c, 'echo $JOBD_JOB_ID >> {out}']\n"
        "    concurrency: 2\n"
        "    lease: {reclaim_after: 60s, renew_every: 10s}\n"
    )
    d = daemon(config)
    try:
        r.xadd("jobd:q", {"job_id": "warm"})
        wait_until(lambda: out.exists(), 20)
        wait_until(lambda: _doorbell_connection(r) is not None, 20)
        other = redis.Redis(port=redis_server.port)
        other.execute_command(
            "CLIENT", "TRACKING", "ON", "REDIRECT", _doorbell_connection(r), "BCAST", "PREFIX", "zz"
        )
        other.set("zz1", "x")  # the invalidation push reaches the daemon mid-wait
        other.close()
        for i in range(5):
            r.xadd("jobd:q", {"job_id": f"j{i}"})
        wait_until(lambda: len(out.read_text().split()) == 6, 4, "all five jobs run at once")
        assert "reader failed" not in d.log()
    finally:
        d.kill()
        proxy.close()


def test_a_producers_jobd_oversize_field_is_not_copied_whole_into_the_log(
    r: redis.Redis, write_config, daemon
) -> None:
    """jobd_oversize is meant to be set by the read scripts only (a stand-in's size), but
    jobd.job takes it from any entry and puts its value, whole, into the malformed reason the
    daemon logs: a producer's 256 KiB value makes one 256 KiB log line (the job id is capped at
    1024 bytes and logged as a 64-byte prefix, so this is the same bloat by another field). On
    9d2400f: "ERROR jobd.daemon: queue=q job=small attempt=1 an entry of XXXX…" of 262 KiB."""
    d = daemon(write_config("redis: {url: '{redis}'}\nqueues:\n  q:\n    command: [/bin/true]\n"))
    r.xadd("jobd:q", {"job_id": "small", "payload": "p", "jobd_oversize": "X" * (256 << 10)})
    wait_until(lambda: r.exists("{jobd:q}:dead") and r.xlen("{jobd:q}:dead") == 1, 20)
    longest = max(len(line) for line in d.log().splitlines())
    assert longest < 16 << 10, f"a log line of {longest} bytes"
