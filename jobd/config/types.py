"""The typed config: one immutable object built from a checked YAML file (``config.load``)
and passed down explicitly. Every other module reads its settings from these classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from jobd.config.redact import redact_url
from jobd.embedded import EmbeddedConfig
from jobd.store.keys import QueueKeys


@dataclass(frozen=True)
class Lease:
    renew_every: float
    reclaim_after: float


@dataclass(frozen=True)
class Retry:
    max_attempts: int
    backoff: float
    max_backoff: float
    jitter: float


@dataclass(frozen=True)
class DeadLetter:
    stream: str
    maxlen: int
    max_age: float | None


@dataclass(frozen=True)
class History:
    """What `jobd job` and `jobd events` can show (docs/concepts/history.md)."""

    max_age: float  # seconds a job's records are kept after its latest one
    maxlen: int  # jobs whose records are kept; 0: none
    output: int  # bytes of each attempt's stdout and stderr tail kept
    events: int  # about this many entries in the queue's events stream


@dataclass(frozen=True)
class Resources:
    """What one handler may use (``resources:``; see docs/concepts/containment.md). None: not
    limited by jobd (the rlimits: inherited from the daemon)."""

    memory: int | None = None  # bytes, the handler's whole tree (memory.max, else sampled)
    pids: int | None = None  # processes and threads of the whole tree (pids.max)
    cpu: float | None = None  # cores (cpu.max)
    address_space: int | None = None  # bytes, RLIMIT_AS of each process
    open_files: int | None = None
    cpu_time: int | None = None  # seconds
    oom_score_adj: int = 500  # the kernel's OOM killer picks handlers before jobd

    def prlimit_args(self) -> list[str]:
        """Options for prlimit(1), soft and hard limit alike."""
        args = []
        for option, value in (("--as", self.address_space), ("--nofile", self.open_files),
                              ("--cpu", self.cpu_time)):  # fmt: skip
            if value is not None:
                args.append(f"{option}={value}:{value}")
        return args


@dataclass(frozen=True)
class Rate:
    """A cluster-wide start rate: ``count`` per ``per`` seconds, ``burst`` at once."""

    count: int
    per: float
    burst: int

    @property
    def per_ms(self) -> float:
        """Tokens added per millisecond."""
        return self.count / (self.per * 1000)


@dataclass(frozen=True)
class ChainStep:
    """A job a queue's config enqueues after each of its own (docs: Workflows): a ``then:``
    step when one is done, its ``on_dead_letter:`` when one is dead-lettered."""

    queue: str  # the target queue's name
    keys: QueueKeys  # the target's (its stream is the one jobs without a priority go to)
    payload: str  # then: result, stdout or payload; on_dead_letter: record
    delay: float | None = None  # seconds after the parent is done; None: at once
    # on_dead_letter: the target's max_payload, which the record's JSON is cut to fit
    # (store/chains.py); None: not known (no bound)
    max_payload: int | None = None


@dataclass(frozen=True)
class QueueConfig:
    name: str
    stream: str
    group: str
    command: tuple[str, ...]
    argv: tuple[str, ...]  # what is executed: the command, behind prlimit(1) when limits are set
    concurrency: int
    # Entries read beyond the free slots (daemon.prefetch): at most this many, or with None
    # (``auto``) up to ``concurrency`` while the queue's recent handlers are short; 0: none.
    prefetch: int | None
    timeout: float
    kill_grace: float
    cwd: str
    # The handler's whole environment, less the JOBD_* variables; not in the repr (secrets).
    env: Mapping[str, str] = field(repr=False)
    lease: Lease
    retry: Retry
    fail_exit_codes: frozenset[int]
    max_deliveries: int
    dead_letter: DeadLetter
    history: History
    retention_maxlen: int | None  # entries the stream keeps (retention.py); None: unbounded
    max_payload: int  # bytes
    result_max: int  # bytes: a handler's result, at most (process.results)
    max_follow_ups: int  # jobs one job may enqueue through JOBD_ENQUEUE (process.followups)
    max_follow_ups_bytes: int  # what those jobs may hold together (outcome.weight)
    resources: Resources
    run_as_user: str | None  # Unix user for handlers (queue key run_as.user)
    run_as_group: (
        str | None
    )  # Unix group for handlers (run_as.group); `group` is the consumer group
    log_payload: int  # bytes of each payload logged at start; 0: none
    dedupe_window: float | None  # seconds a completed job id is remembered; None: no dedupe
    schedule: tuple[ScheduleConfig, ...]  # periodic jobs (see periodic.py)
    slots: int | None  # limits.concurrency: handlers across all daemons; None: no limit
    rate: Rate | None  # limits.rate and limits.burst; None: no limit
    starvation_after: float | None  # priorities: a lower level's job waiting this long goes first
    max_wait: float | None  # a job not started this long after it was enqueued expires
    keys: QueueKeys  # every Redis key of the queue, derived in jobd/store/keys.py
    # Priority levels: this config's level (None without priorities), and on the queue's own
    # config every level's, highest first, each with its stream and delayed set (the default
    # level's stream is the queue's); the others share the queue's keys (keys.py).
    priority: str | None = None
    levels: tuple[QueueConfig, ...] = ()
    # What a handler may say on its NOTIFY_SOCKET (process.channel): the longest an attempt may
    # run, however it extends its deadline (None: its timeout); how long it may be silent once
    # it has sent WATCHDOG=1 (None: no watchdog); and stdout's "N%" lines taken as progress.
    max_timeout: float | None = None
    watchdog: float | None = None
    progress_from_output: bool = False
    # Declarative chains (config.chains, process.chains): follow-ups of each done job, and
    # the job the dead-letter record of each dead-lettered one goes to; none by default.
    then: tuple[ChainStep, ...] = ()
    on_dead_letter: ChainStep | None = None

    def all_levels(self) -> tuple[QueueConfig, ...]:
        """Where jobs of this queue are read from, highest priority first."""
        return self.levels or (self,)

    def level(self, name: str) -> QueueConfig:
        """Priority level ``name``; ValueError, saying which there are, when there is none."""
        for q in self.levels:
            if q.priority == name:
                return q
        names = ", ".join(str(q.priority) for q in self.levels)
        has = f"the levels {names}" if names else "no priority levels"
        raise ValueError(f"queue {self.name!r} has {has}, not {name!r}")


@dataclass(frozen=True)
class ScheduleConfig:
    name: str
    cron: str
    timezone: str
    payload: bytes
    catch_up: float  # seconds


@dataclass(frozen=True)
class TLS:
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify_hostname: bool = True


Node = tuple[str, int]  # host, port


@dataclass(frozen=True)
class SentinelConfig:
    master: str  # the master's name in the sentinels' configuration
    nodes: tuple[Node, ...]  # the sentinels
    db: int = 0
    username: str | None = None  # the sentinels' own credentials
    password: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class RedisConfig:
    """Where Redis is: exactly one of a URL (one server; an embedded one's socket when
    ``embedded`` is set), a cluster's seed nodes, or a Sentinel group."""

    url: str = ""
    username: str | None = None
    password: str | None = field(default=None, repr=False)  # never printed, never logged
    tls: TLS = TLS()
    embedded: EmbeddedConfig | None = None  # jobd runs this server itself (url is its socket)
    cluster: tuple[Node, ...] | None = None  # seed nodes of a Redis Cluster
    sentinel: SentinelConfig | None = None

    def __repr__(self) -> str:  # the URL may carry a password
        return (
            f"RedisConfig({self.describe()!r}, username={self.username!r}, tls={self.tls!r}, "
            f"embedded={self.embedded!r})"
        )

    def describe(self) -> str:
        """Where Redis is, for logs and messages; never a password."""
        if self.cluster:
            return "Redis Cluster via " + ", ".join(format_node(n) for n in self.cluster)
        if self.sentinel:
            nodes = ", ".join(format_node(n) for n in self.sentinel.nodes)
            return f"master {self.sentinel.master!r} of Sentinel {nodes}"
        return self.redacted_url()

    def redacted_url(self) -> str:
        """The URL with any password (userinfo, ``?password=``) replaced, for logs and summaries."""
        return redact_url(self.url)


def format_node(node: Node) -> str:
    host, port = node
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class Config:
    path: str
    redis: RedisConfig
    queues: Mapping[str, QueueConfig]
    shutdown_grace: float
    metrics_listen: str | None = None  # HOST:PORT for /metrics and /healthz
    cgroup: str = "auto"  # auto, off, or a cgroup's path (process.cgroup)
    dashboard: DashboardConfig = field(default_factory=lambda: DashboardConfig())
    # Daemon processes on this host (``auto`` resolved to the CPUs); over 1, ``jobd run`` is
    # their supervisor (daemon.supervisor).
    processes: int = 1
    tracing: TracingConfig | None = None  # jobd's own spans (jobd.tracing); None: not configured
    # SHA-256 of the text it was loaded from (hex): how a supervisor learns which text a daemon
    # runs after a reload it may have refused (daemon.supervisor). Not part of what compares.
    digest: str = field(default="", compare=False, repr=False)


@dataclass(frozen=True)
class TracingConfig:
    """jobd's own spans over OTLP/HTTP (jobd.tracing, the ``otel`` extra)."""

    enabled: bool = False
    otlp_endpoint: str | None = None  # None: the exporter's (OTEL_EXPORTER_OTLP_* variables)
    service: str = "jobd"  # the spans' service.name


@dataclass(frozen=True)
class DashboardConfig:
    """The page next to the metrics (dashboard.py): read-only unless ``actions``."""

    actions: bool = False  # requeue and purge dead letters from the page
    token: str | None = field(default=None, repr=False)  # needed on every request when set
    show_payloads: bool = False
    allowed_hosts: tuple[str, ...] = ()  # Host names answered besides IPs and loopback names
