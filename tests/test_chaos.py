"""Chaos: real daemons reaching a real Redis through fault-injecting proxies (tests/faultproxy.py)
while a bounded fault schedule runs: latency bursts, connections cut mid-reply, partitions
longer than reclaim_after, a daemon SIGKILLed and replaced, Redis unreachable.

After healing, every test checks by polling that nothing was lost (every job ran), nothing is
wedged (the group's PEL and the delayed set drain, jobs enqueued afterwards run) and counts
duplicates: a delivery run twice is allowed only where a lease really lapsed (a partition or a
kill longer than reclaim_after), never because of latency or a cut connection alone.

The first tests check the proxy itself.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from faultproxy import FaultProxy
from redis.backoff import NoBackoff
from redis.retry import Retry
from support import DaemonProcess, group_info, pending_count, wait_until

Daemon = Callable[..., DaemonProcess]

STREAM = "jobd:work"
DELAYED = "{jobd:work}:delayed"
DEAD = "{jobd:work}:dead"
RUNNING = "{jobd:work}:running"


# -- the proxy itself ---------------------------------------------------------------------------


def recv_until(sock: socket.socket, end: bytes, limit: int = 1 << 16) -> bytes:
    """Read until ``end`` is seen (bounded by ``limit`` bytes and the socket's timeout)."""
    data = b""
    while end not in data and len(data) < limit:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def recv_all(sock: socket.socket, limit: int = 1 << 16) -> bytes:
    """Read until EOF (bounded); a reset is raised."""
    data = b""
    while len(data) < limit:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def test_proxy_forwards_and_adds_latency(r: redis.Redis, redis_server) -> None:
    with FaultProxy(redis_server.port) as proxy:
        client = redis.Redis(port=proxy.port, socket_timeout=5)
        assert client.set("k", "v") and client.get("k") == b"v"
        proxy.latency(0.2)
        started = time.monotonic()
        assert client.ping()
        slow = time.monotonic() - started
        proxy.restore()
        started = time.monotonic()
        assert client.ping()
        fast = time.monotonic() - started
        client.close()
    assert slow >= 0.39, "the request and the reply are each delayed 0.2 s"
    assert fast < slow - 0.2


@pytest.mark.parametrize("reset", [True, False], ids=["rst", "fin"])
def test_proxy_cuts_in_the_middle_of_a_reply(r: redis.Redis, redis_server, reset: bool) -> None:
    r.set("k", b"v" * 1000)
    with FaultProxy(redis_server.port) as proxy:
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        sock.sendall(b"PING\r\n")
        assert recv_until(sock, b"\r\n") == b"+PONG\r\n"
        assert proxy.cut(reset=reset, after_reply_bytes=10) == 1
        sock.sendall(b"GET k\r\n")
        if reset:
            got = b""
            with pytest.raises(ConnectionResetError):
                while len(got) < 2000:
                    chunk = sock.recv(4096)
                    assert chunk, "a reset, not an EOF"
                    got += chunk
        else:
            got = recv_all(sock)
        sock.close()
        wait_until(lambda: proxy.connections() == 0, 5, "the proxy to drop the connection")
        assert proxy.cuts == 1
    assert got == (b"$1000\r\n" + b"v" * 1000)[:10]


def test_proxy_blackhole_holds_then_delivers(r: redis.Redis, redis_server) -> None:
    with FaultProxy(redis_server.port) as proxy:
        old = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        old.sendall(b"PING\r\n")
        assert recv_until(old, b"\r\n") == b"+PONG\r\n"
        proxy.blackhole(0.8)
        started = time.monotonic()
        old.sendall(b"INCR n\r\n")
        new = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)  # accepted
        new.sendall(b"INCR n\r\n")
        old.settimeout(0.3)
        with pytest.raises(TimeoutError):
            old.recv(100)
        assert r.get("n") is None, "nothing reached Redis"
        old.settimeout(5)
        replies = {recv_until(old, b"\r\n"), recv_until(new, b"\r\n")}
        assert time.monotonic() - started >= 0.75
        assert replies == {b":1\r\n", b":2\r\n"}, "both held commands ran once the hole closed"
        old.close()
        new.close()


def test_proxy_refuses_then_restores(r: redis.Redis, redis_server) -> None:
    with FaultProxy(redis_server.port) as proxy:
        client = redis.Redis(port=proxy.port, socket_timeout=5, retry=Retry(NoBackoff(), 0))
        assert client.ping()
        proxy.refuse()
        assert client.ping(), "open connections are untouched"
        assert proxy.cut() == 1
        with pytest.raises(redis.ConnectionError):
            client.ping()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", proxy.port), timeout=2).close()
        proxy.restore()
        assert client.ping()
        client.close()


# -- the workload ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    job_id: str
    message_id: str
    attempt: int


def record_handler(script, tmp_path: Path) -> Path:
    """A handler that appends one line per run (O_APPEND, one write) and exits 0, except that
    jobs named retry-* fail their first attempt (exit 75: retried after the backoff)."""
    ran = tmp_path / "ran"
    script(
        "record.sh",
        f"""
        #!/bin/sh
        printf '%s %s %s\\n' "$JOBD_JOB_ID" "$JOBD_MESSAGE_ID" "$JOBD_ATTEMPT" >> {ran}
        case "$JOBD_JOB_ID" in
          retry-*) [ "$JOBD_ATTEMPT" = 1 ] && exit 75 ;;
        esac
        exit 0
        """,
    )
    return ran


def runs(path: Path) -> list[Run]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        job_id, message_id, attempt = line.split()
        out.append(Run(job_id, message_id, int(attempt)))
    return out


def done(all_runs: list[Run]) -> set[str]:
    """Job ids with a successful run (retry-* succeed from their second attempt)."""
    return {
        run.job_id for run in all_runs if not run.job_id.startswith("retry-") or run.attempt >= 2
    }


def duplicates(all_runs: list[Run]) -> dict[str, list[str]]:
    """Job id -> the message ids (deliveries) that ran more than once."""
    counts = Counter((run.job_id, run.message_id) for run in all_runs)
    dups: dict[str, list[str]] = {}
    for (job_id, message_id), n in counts.items():
        if n > 1:
            dups.setdefault(job_id, []).extend([message_id] * (n - 1))
    return dups


class Producer:
    """Adds jobs straight to Redis (producers are not behind the proxies): at once with
    ``add``, or at a steady rate from a thread with ``start`` (so that faults land mid-flow)."""

    def __init__(self, r: redis.Redis) -> None:
        self.r = redis.Redis(port=r.connection_pool.connection_kwargs["port"])
        self.ids: list[str] = []
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def add(self, n: int, retry_every: int = 0) -> None:
        pipe = self.r.pipeline(transaction=False)
        with self._lock:
            for _ in range(n):
                i = len(self.ids)
                job_id = f"retry-{i}" if retry_every and i % retry_every == 0 else f"job-{i}"
                pipe.xadd(STREAM, {"payload": b"x", "job_id": job_id})
                self.ids.append(job_id)
        pipe.execute()

    def start(self, n: int, per_second: float, retry_every: int = 0) -> None:
        """Add ``n`` jobs over ``n / per_second`` seconds, in the background."""

        def produce() -> None:
            began = time.monotonic()
            for i in range(n):
                delay = began + i / per_second - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                self.add(1, retry_every)

        self._thread = threading.Thread(target=produce, name="producer", daemon=True)
        self._thread.start()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join(60)
            assert not self._thread.is_alive(), "the producer did not finish"

    def close(self) -> None:
        self.r.close()


SHORT_LEASE = "{renew_every: 200ms, reclaim_after: 1s}"
# Where no lease may lapse, a margin against a daemon stalled by a busy 2-core host: a lapse
# there would be a legitimate duplicate, not the finding the test looks for.
SAFE_LEASE = "{renew_every: 300ms, reclaim_after: 2s}"


def chaos_config(
    url: str, queue_extra: str = "", concurrency: int = 4, lease: str = SHORT_LEASE
) -> str:
    return (
        f"redis: {{url: '{url}'}}\n"
        "defaults:\n"
        f"  lease: {lease}\n"
        "  retry: {backoff: 200ms, max_backoff: 1s, jitter: 0}\n"
        "queues:\n"
        f"  work: {{command: [./record.sh], concurrency: {concurrency}{queue_extra}}}\n"
    )


def hold(seconds: float) -> None:
    """Let a fault last ``seconds`` (pacing the schedule, not an assertion)."""
    end = time.monotonic() + seconds
    wait_until(lambda: time.monotonic() >= end, seconds + 5, f"{seconds}s to pass")


def poll(predicate: Callable[[], object], timeout: float) -> bool:
    """Like wait_until, but a timeout is an answer, not a failure."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def drained(r: redis.Redis) -> bool:
    """No entry pending, none undelivered, nothing waiting in the delayed set."""
    try:
        info = group_info(r, STREAM)
    except (redis.ResponseError, StopIteration):
        return False
    return pending_count(r, STREAM) == 0 and info["lag"] == 0 and r.zcard(DELAYED) == 0


def wait_all_done(r: redis.Redis, ran: Path, jobs: Producer, timeout: float) -> None:
    def finished() -> bool:
        return set(jobs.ids) <= done(runs(ran)) and drained(r)

    if not poll(finished, timeout):
        missing = sorted(set(jobs.ids) - done(runs(ran)))
        pending = r.xpending_range(STREAM, "jobd", "-", "+", 20) if pending_count(r, STREAM) else []
        pytest.fail(
            f"after {timeout}s: {len(missing)} job(s) never ran successfully "
            f"(first: {missing[:10]}); pending {pending_count(r, STREAM)} "
            f"(first: {[(p['message_id'], p['consumer'], p['times_delivered']) for p in pending]}); "
            f"delayed {r.zcard(DELAYED)}; dead-lettered {r.xlen(DEAD)}"
        )


def start_daemons(write_config, daemon: Daemon, proxies: list[FaultProxy], **kw) -> list:
    return [
        daemon(write_config(chaos_config(p.url, **kw), f"d{i}.yaml")) for i, p in enumerate(proxies)
    ]


def taken_over(daemons: list[DaemonProcess]) -> set[str]:
    """Job ids some daemon took over after their lease lapsed (from every daemon's log)."""
    found = set()
    for d in daemons:
        for line in d.log().splitlines():
            if "lease lapsed; taken over" in line and " job=" in line:
                found.add(line.split(" job=", 1)[1].split()[0])
    return found


def _cut(**kw: object) -> Callable[[FaultProxy], object]:
    return lambda p: p.cut(**kw)


def _latency(seconds: float) -> Callable[[FaultProxy], object]:
    return lambda p: (p.restore(), p.latency(seconds))


# (what, applied to every proxy, then held for seconds): latency bursts, and every open
# connection cut at once or in its next reply, after 1 to 100 bytes of it (inside a reply's
# header, inside a bulk string, between two replies of a pipeline), with RST or FIN.
LATENCY_AND_CUTS: list[tuple[str, Callable[[FaultProxy], object], float]] = [
    ("latency 30ms", _latency(0.03), 0.6),
    ("cut after 3 bytes, RST, under latency", _cut(after_reply_bytes=3), 0.5),
    ("latency 80ms", _latency(0.08), 0.5),
    ("cut after 1 byte, FIN, under latency", _cut(reset=False, after_reply_bytes=1), 0.5),
    ("no latency", _latency(0), 0.3),
    ("cut after 7 bytes, RST", _cut(after_reply_bytes=7), 0.4),
    ("cut after 40 bytes, FIN", _cut(reset=False, after_reply_bytes=40), 0.4),
    ("latency 50ms", _latency(0.05), 0.3),
    ("cut after 100 bytes, RST, under latency", _cut(after_reply_bytes=100), 0.4),
    ("no latency", _latency(0), 0.2),
    ("every connection reset at once", _cut(), 0.2),
    ("then their next replies cut after 20 bytes", _cut(after_reply_bytes=20), 0.4),
]


def test_latency_and_cuts_mid_reply_lose_nothing_and_run_nothing_twice(
    r: redis.Redis, redis_server, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """No partition, no kill: only latency bursts and connections cut (mid-reply, RST and FIN,
    and at once). No lease can lapse here, so no delivery may run twice."""
    ran = record_handler(script, tmp_path)
    jobs = Producer(r)
    faults: list[str] = []
    with contextlib.ExitStack() as stack:
        stack.callback(jobs.close)
        proxies = [stack.enter_context(FaultProxy(redis_server.port)) for _ in range(2)]
        daemons = start_daemons(write_config, daemon, proxies, lease=SAFE_LEASE)

        jobs.start(200, per_second=40, retry_every=7)  # 5 s of steady load
        for what, fault, seconds in LATENCY_AND_CUTS:
            for p in proxies:
                fault(p)
            hold(seconds)
            faults.append(what)
        for p in proxies:
            p.restore()
        jobs.join()
        cuts = sum(p.cuts for p in proxies)

        jobs.add(20)  # after healing: the queue keeps moving
        wait_all_done(r, ran, jobs, 30)

        all_runs = runs(ran)
        dups = duplicates(all_runs)
        print(
            f"latency+cuts: {len(jobs.ids)} jobs, {len(all_runs)} runs, {cuts} connections cut, "
            f"deliveries run twice: {sum(len(v) for v in dups.values())}, "
            f"taken over: {len(taken_over(daemons))}"
        )
        assert cuts >= 2 * len(proxies), "the schedule really cut connections"
        assert set(jobs.ids) <= done(all_runs), "nothing lost"
        assert dups == {}, (
            "deliveries ran twice with no partition and no kill (latency and cut connections "
            f"alone): {dups}; of those jobs, taken over after a lapse: "
            f"{sorted(set(dups) & taken_over(daemons))}; faults: {faults}"
        )
        assert r.xlen(DEAD) == 0, r.xrange(DEAD, count=5)
        for d in daemons:
            assert d.proc.poll() is None, "the daemon died"


def test_partitions_and_a_killed_daemon_lose_nothing_and_wedge_nothing(
    r: redis.Redis, redis_server, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Partitions longer than reclaim_after (one daemon, then all), a daemon SIGKILLed and a
    new one started, replies cut as the partition heals: nothing lost, nothing wedged, and
    every delivery that ran twice belongs to a job a daemon took over after its lease lapsed."""
    ran = record_handler(script, tmp_path)
    jobs = Producer(r)
    with contextlib.ExitStack() as stack:
        stack.callback(jobs.close)
        proxies = [stack.enter_context(FaultProxy(redis_server.port)) for _ in range(3)]
        daemons = start_daemons(write_config, daemon, proxies)

        jobs.start(200, per_second=30, retry_every=8)  # 6.7 s of steady load
        hold(0.5)
        proxies[0].blackhole(2.5)  # daemon 0 partitioned: its leases lapse, others take over
        hold(2.6)
        daemons[1].kill()  # SIGKILL, its handlers too; a new daemon takes its place
        daemons.append(daemon(write_config(chaos_config(proxies[1].url), "d1-again.yaml")))
        for p in proxies:  # Redis unreachable from every daemon for longer than reclaim_after
            p.blackhole(2.0)
        hold(2.0)
        for p in proxies:  # and the first replies after it are cut
            p.cut(after_reply_bytes=5)
        hold(1.0)
        for p in proxies:
            p.restore()
        jobs.join()
        cuts = sum(p.cuts for p in proxies)

        jobs.add(20)  # after healing: the queue keeps moving
        wait_all_done(r, ran, jobs, 40)

        all_runs = runs(ran)
        dups = duplicates(all_runs)
        lapsed = taken_over(daemons)
        print(
            f"partitions+kill: {len(jobs.ids)} jobs, {len(all_runs)} runs, {cuts} cuts, "
            f"deliveries run twice: {sum(len(v) for v in dups.values())} "
            f"(jobs {sorted(dups)}), jobs taken over after a lapse: {len(lapsed)}"
        )
        assert set(jobs.ids) <= done(all_runs), "nothing lost"
        unexplained = sorted(set(dups) - lapsed)
        assert not unexplained, f"run twice with no lease lapse logged for them: {unexplained}"
        assert r.xlen(DEAD) == 0, r.xrange(DEAD, count=5)
        for d in [daemons[0], daemons[2], daemons[3]]:
            assert d.proc.poll() is None, "the daemon died"


def test_limited_queue_runs_again_after_redis_unreachable_while_idle(
    r: redis.Redis, redis_server, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """limits.concurrency 2 over two daemons of local concurrency 2: Redis unreachable for 3 s
    (connections reset, new ones refused) while both are idle; then 3 new jobs must all run,
    never more than 2 at once."""
    events = tmp_path / "events"
    script(
        "record.sh",
        f"""
        #!/bin/sh
        echo "start $JOBD_JOB_ID" >> {events}
        sleep 0.3
        echo "end $JOBD_JOB_ID" >> {events}
        """,
    )

    def ended() -> set[str]:
        text = events.read_text() if events.exists() else ""
        return {line.split()[1] for line in text.splitlines() if line.startswith("end ")}

    with FaultProxy(redis_server.port) as proxy:
        extra = ", limits: {concurrency: 2}"
        daemons = [
            daemon(write_config(chaos_config(proxy.url, extra, concurrency=2), f"d{i}.yaml"))
            for i in range(2)
        ]
        for i in range(2):
            r.xadd(STREAM, {"payload": b"x", "job_id": f"warm-{i}"})
        wait_until(lambda: {"warm-0", "warm-1"} <= ended(), what="the warm-up jobs")
        wait_until(lambda: pending_count(r, STREAM) == 0, what="the warm-up jobs acked")
        hold(1.5)  # idle: readers waiting for entries

        proxy.refuse()
        proxy.cut()
        hold(3.0)
        proxy.restore()
        back = time.monotonic()

        for i in range(3):
            r.xadd(STREAM, {"payload": b"x", "job_id": f"after-{i}"})
        new = {f"after-{i}" for i in range(3)}
        ok = poll(lambda: new <= ended() and pending_count(r, STREAM) == 0, 15)
        took = time.monotonic() - back
        slots = r.zrange(RUNNING, 0, -1, withscores=True)
        waiting = r.hgetall("{jobd:work}:waiting")
        assert ok, (
            f"15 s after Redis came back, jobs {sorted(new - ended())} never ran; "
            f"running set {slots}, waiting {waiting}, pending {pending_count(r, STREAM)}"
        )
        print(f"limited queue: the 3 jobs ran {took:.1f}s after Redis came back")

        running = peak = 0
        for line in events.read_text().splitlines():
            running += 1 if line.startswith("start ") else -1
            peak = max(peak, running)
        assert peak <= 2, f"{peak} handlers ran at once under limits.concurrency 2"
        for d in daemons:
            assert d.proc.poll() is None, "the daemon died"
