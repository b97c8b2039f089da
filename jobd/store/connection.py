"""Redis clients with deliberately chosen timeouts and retries.

redis-py (8.x) defaults to ``socket_timeout=5`` and re-sends failed commands up to 10 times.
jobd keeps ``BLOCK`` short (1 s) so loops notice shutdown, sets the socket timeout well above
it, and never lets the client re-send by itself: each caller decides what is safe to repeat
(an XACK is; an ``XADD *`` or ``XREADGROUP >`` is not).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import (
    AskError,
    ClusterError,
    MasterDownError,
    MovedError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.retry import Retry
from redis.sentinel import Sentinel

from jobd.config import RedisConfig

BLOCK_MS = 1000
SOCKET_TIMEOUT = 10.0  # well above BLOCK_MS: a blocking read must not time out by itself
CONNECT_TIMEOUT = 5.0

# What a caller treats as "Redis is away for now": retry later, never a job's failure. A
# Sentinel that knows no master raises a ConnectionError; a cluster mid-failover or with a
# slot not served answers CLUSTERDOWN / TRYAGAIN, or redis-py finds no node for the slot.
UNAVAILABLE = (
    redis.ConnectionError, redis.TimeoutError, OSError,
    ClusterError, TryAgainError, SlotNotCoveredError,
)  # fmt: skip
BACKOFF_START = 0.1
BACKOFF_MAX = 5.0


class Outage:
    """A thread's view of Redis being away: logged once when it goes and once when it is
    back (not once per retry), with the capped exponential wait between retries."""

    def __init__(self, logger: logging.Logger, prefix: str = "") -> None:
        self.log, self.prefix = logger, prefix
        self.active = False
        self.backoff = BACKOFF_START

    def down(self, exc: BaseException, note: str) -> float:
        """Redis failed a call; returns how long to wait before the next try."""
        if not self.active:
            self.log.warning("%sRedis unreachable (%s); %s", self.prefix, exc, note)
            self.active = True
        delay, self.backoff = self.backoff, min(self.backoff * 2, BACKOFF_MAX)
        return delay

    def up(self, note: str = "") -> None:
        """A call succeeded."""
        if self.active:
            self.log.info("%sRedis reachable again%s", self.prefix, note)
            self.active = False
        self.backoff = BACKOFF_START


def away(exc: BaseException) -> bool:
    """Whether an error (raised, or a reply in a pipeline) means Redis cannot take writes for
    now, not that the call is wrong: it is away, loading, a replica after a failover, busy
    running another script, out of memory. A caller keeps the work and tries again later."""
    if isinstance(exc, (*UNAVAILABLE, ReadOnlyError, OutOfMemoryError, MasterDownError)):
        return True
    return isinstance(exc, redis.ResponseError) and str(exc).startswith("BUSY ")


class SlotMigrating(ClusterError):
    """A queue's cluster slot migrates, and what was asked of it needs a script of several of
    its keys, which Redis refuses until the migration ends: Redis away, for that queue."""


def migrating(exc: BaseException) -> bool:
    """Whether an error says the keys' cluster slot is being migrated (resharding), with the
    command's keys not all on the node it reached: Redis refuses a command of several keys
    then (TRYAGAIN; ASK, at the source, when it has none of them, then TRYAGAIN at the target),
    and the cluster client, after 16 tries, gives up ("TTL exhausted"). Nothing ran. A command
    of one key is served wherever the key is (the cluster client follows ASK)."""
    if isinstance(exc, MovedError):
        return False
    if isinstance(exc, (TryAgainError, AskError, SlotMigrating)):
        return True
    return type(exc) is ClusterError and "TTL exhausted" in str(exc)


class _FailoverAware:
    """A connection that treats READONLY as the failover it is: the server it reached is a
    replica now. The connection is dropped, so the next call connects again (to whatever the
    address names now: a moved VIP or DNS name), and callers see a ConnectionError, Redis being
    away, instead of an error they would take for the call's own (what redis-py's Sentinel
    connection does)."""

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().read_response(*args, **kwargs)  # type: ignore[misc]
        except ReadOnlyError as exc:
            self.disconnect()  # type: ignore[attr-defined]
            raise redis.ConnectionError(f"READONLY {exc}: the server is a replica now") from exc


class _TCP(_FailoverAware, redis.Connection):
    pass


class _TLS(_FailoverAware, redis.SSLConnection):
    pass


class _Unix(_FailoverAware, redis.UnixDomainSocketConnection):
    pass


def client(config: RedisConfig, name: str = "jobd") -> redis.Redis:
    """A client for wherever the config says Redis is: one server, a cluster (commands routed
    by their keys' slot, redirections followed) or the master a Sentinel group names (found
    again on every new connection, so a failover is followed after one failed call)."""
    options: dict[str, Any] = {
        "socket_timeout": SOCKET_TIMEOUT,
        "socket_connect_timeout": CONNECT_TIMEOUT,
        "health_check_interval": 30,
        "retry": Retry(NoBackoff(), 0),
        "client_name": name,
        "decode_responses": False,
    }
    if not config.url.startswith("unix://"):
        options["socket_keepalive"] = True  # TCP only: notice a dead peer
    if config.username is not None:
        options["username"] = config.username
    if config.password is not None:
        options["password"] = config.password
    if config.cluster:
        nodes = [ClusterNode(host, port) for host, port in config.cluster]
        return RedisCluster(startup_nodes=nodes, **options)  # type: ignore[return-value]
    if config.sentinel:
        s = config.sentinel
        own = {"username": s.username, "password": s.password}
        sentinel = Sentinel(
            list(s.nodes),
            sentinel_kwargs={
                "socket_timeout": CONNECT_TIMEOUT,
                "socket_connect_timeout": CONNECT_TIMEOUT,
                **{k: v for k, v in own.items() if v is not None},
            },
        )
        return sentinel.master_for(s.master, redis_class=redis.Redis, db=s.db, **options)
    options["connection_class"] = _TCP
    if config.url.startswith("unix://"):
        options["connection_class"] = _Unix
    if config.url.startswith("rediss://"):
        tls = config.tls
        options.update(
            connection_class=_TLS,
            ssl_ca_certs=tls.ca_file,
            ssl_certfile=tls.cert_file,
            ssl_keyfile=tls.key_file,
            ssl_check_hostname=tls.verify_hostname,
        )
    return redis.Redis.from_url(config.url, **options)


def refresh(client: redis.Redis | RedisCluster) -> None:
    """After a call failed for want of Redis, on a cluster: ask the cluster again which node
    serves each slot, and pick another default node. redis-py refreshes its slot map only when
    a command it routed itself fails, and replaces its default node (which answers COMMAND
    GETKEYS for every XREADGROUP and XREAD) only when it may retry, which jobd forbids: without
    this a dead master stays in the map, and as the default node, for good."""
    if not isinstance(client, RedisCluster):
        return
    try:
        client.nodes_manager.initialize()
        client.replace_default_node()
    except (*UNAVAILABLE, RedisClusterException):  # still away: the caller retries anyway
        pass


def node_for(client: redis.Redis | RedisCluster, key: str) -> redis.Redis:
    """The plain client of the server that holds ``key``: on a cluster, the node serving its
    slot (for what the cluster client cannot route: EVALSHA in a pipeline, WAIT after a
    write); otherwise ``client`` itself."""
    if isinstance(client, RedisCluster):
        return client.get_node_from_key(key).redis_connection
    return client


# The commands jobd sends, directly or from its scripts: what an ACL user for jobd needs.
# (redis-py also sends CLIENT SETINFO on 7.2+ and ignores a refusal.)
# `ACL SETUSER jobd on >PASSWORD ~<key patterns> resetchannels -@all +<each of these>`
ACL_COMMANDS = (
    "ping", "info", "client|setname", "evalsha", "eval", "script|load",
    "script|exists", "xreadgroup", "xadd", "xack", "xclaim", "xautoclaim", "xpending", "xrange",
    "xrevrange", "xlen", "xdel", "xtrim", "xinfo|groups", "xinfo|consumers", "xgroup|create",
    "xgroup|delconsumer", "zadd", "zrangebyscore", "zrange", "zrem", "zcard", "del",
    "hincrby", "expire", "hgetall", "wait", "get", "set", "exists", "pexpire", "hget", "hmget",
    "hset", "hdel", "zcount", "zremrangebyscore", "xread", "time", "zscore", "type", "hsetnx",
    "hstrlen", "hexists", "sismember", "sadd", "hscan", "pttl", "hlen", "object|encoding",
    "memory|usage", "hrandfield", "scard",
)  # fmt: skip
# ... and on Redis 7.2+, "waitaof" for `jobd enqueue --wait-aof` (7.0 refuses the name in ACLs).


class Clock:
    """Redis's clock, Unix seconds, read once per server a request reads (``at``): ages and
    minute windows are measured on it, never on the host's clock, so any host shows the same
    figures. On a cluster each node's own, read the first time one of its keys is asked for."""

    def __init__(self, client: redis.Redis | RedisCluster) -> None:
        self.client = client
        self.read: dict[int, float] = {}

    def at(self, key: str) -> float:
        """Redis's time on the server holding ``key``, read once (the first call) per server."""
        node = node_for(self.client, key)
        if id(node) not in self.read:
            seconds, micros = node.time()
            self.read[id(node)] = int(seconds) + int(micros) / 1_000_000
        return self.read[id(node)]


class KeptClock:
    """Redis's clock for a long-lived store (a daemon's thread, a tool): ``TIME`` read at most
    every ``KEEP`` seconds per server, carried forward on this host's monotonic clock in
    between (its rate, not its wall time: a host whose wall clock is minutes off, or is set
    meanwhile, still names Redis's minute). What picks the per-minute figures' keys on the
    settle path without a round trip of its own there (one ``TIME`` a minute, at a call that
    needs it). On a cluster each node's own."""

    KEEP = 60.0

    def __init__(self, client: redis.Redis | RedisCluster) -> None:
        self.client = client
        # id(node) -> Redis's time read, time.monotonic() then, and when to read it again
        self.read: dict[int, tuple[float, float, float]] = {}

    def now(self, key: str) -> float:
        """Redis's time now (Unix seconds) on the server holding ``key``: within half a round
        trip (and the host clock's drift for a minute) of its ``TIME``. When ``TIME`` fails, the
        last one read carried forward; when none was ever read, this host's clock, this once."""
        node = node_for(self.client, key)
        kept = self.read.get(id(node))
        mono = time.monotonic()
        if kept is None or mono >= kept[2]:
            try:
                seconds, micros = node.time()
                after = time.monotonic()
                kept = (int(seconds) + int(micros) / 1e6, (mono + after) / 2, after + self.KEEP)
                self.read[id(node)] = kept
            except (*UNAVAILABLE, redis.RedisError, RedisClusterException) as exc:
                logging.getLogger(__name__).debug("cannot read Redis's clock: %r", exc)
                if kept is None:
                    return time.time()
                self.read[id(node)] = kept = (*kept[:2], mono + 1.0)  # not at every call
        return kept[0] + (time.monotonic() - kept[1])

    def offset(self, key: str) -> float:
        """Redis's clock minus this host's wall clock, seconds (``Job.clock_offset``)."""
        return self.now(key) - time.time()

    def forget(self) -> None:
        """Redis went away (it may come back as another server, with another clock): read
        ``TIME`` again at the next call, what was read kept meanwhile if it fails."""
        self.read = {node: (at, mono, 0.0) for node, (at, mono, _) in self.read.items()}
