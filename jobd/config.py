"""The config: one immutable, typed object built from the YAML file and passed down explicitly.

``load()`` reads the file, expands ``${VAR}``, validates it against ``schema.json``, merges
``defaults`` into each queue, applies the documented defaults, checks what a schema cannot
(see ``validation``), and either returns a ``Config`` or raises ``ConfigError`` carrying every
problem found, each with its line and column.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import orjson

from jobd import durations, keys, sizes, validation, yamlsrc
from jobd.embedded import EmbeddedConfig
from jobd.handler_env import base_environment
from jobd.keys import QueueKeys
from jobd.validation import Problem

DEFAULT_CONFIG = "/etc/jobd/jobd.yaml"


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
class Limits:
    """Per-handler resource limits; None: inherited from the daemon."""

    address_space: int | None = None  # bytes
    open_files: int | None = None
    cpu_time: int | None = None  # seconds

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
class QueueConfig:
    name: str
    stream: str
    group: str
    command: tuple[str, ...]
    argv: tuple[str, ...]  # what is executed: the command, behind prlimit(1) when limits are set
    concurrency: int
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
    retention_maxlen: int | None
    max_payload: int  # bytes
    limits: Limits
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
    keys: QueueKeys  # every Redis key of the queue, derived in jobd/keys.py
    # Priority levels: this config's level (None without priorities), and on the queue's own
    # config every level's, highest first, each with its stream and delayed set (the default
    # level's stream is the queue's); the others share the queue's keys (keys.py).
    priority: str | None = None
    levels: tuple[QueueConfig, ...] = ()

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
        return validation.redact_url(self.url)


def parse_node(text: str) -> Node:
    """``HOST:PORT`` or ``[IPV6]:PORT`` (the schema has checked the form)."""
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


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
    dashboard: DashboardConfig = field(default_factory=lambda: DashboardConfig())


@dataclass(frozen=True)
class DashboardConfig:
    """The page next to the metrics (dashboard.py): read-only unless ``actions``."""

    actions: bool = False  # requeue and purge dead letters from the page
    token: str | None = field(default=None, repr=False)  # needed on every request when set
    show_payloads: bool = False
    allowed_hosts: tuple[str, ...] = ()  # Host names answered besides IPs and loopback names


class ConfigError(Exception):
    """The config is invalid; ``problems`` lists every problem, in file order."""

    def __init__(self, path: str, problems: list[Problem]) -> None:
        super().__init__(f"{path}: {len(problems)} problem(s)")
        self.path = path
        self.problems = sorted(problems)


def read_text(path: str) -> str:
    """The config file's text; raises ConfigError with a one-line reason when unreadable."""
    try:
        raw = Path(path).read_bytes()
    except IsADirectoryError:
        raise ConfigError(path, [Problem.whole_file("is a directory, not a config file")]) from None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(path, [Problem.whole_file(f"cannot read the file: {reason}")]) from None
    if b"\x00" in raw:
        raise ConfigError(path, [Problem.whole_file("is a binary file, not a YAML config")])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            path, [Problem.whole_file(f"is not UTF-8 text (byte {exc.start}); save it as UTF-8")]
        ) from None


def load(path: str, environ: Mapping[str, str] | None = None) -> Config:
    environ = dict(os.environ if environ is None else environ)
    text = read_text(path)
    try:
        doc, expand_errors = yamlsrc.load(text, environ, validation.is_text)
    except yamlsrc.SourceError as exc:
        raise ConfigError(path, [Problem(exc.pos or yamlsrc.Pos(1, 1), (), exc.message)]) from None
    if not isinstance(doc.data, dict):
        kind = validation.kind_of(doc.data)  # not the value: it may be a secret
        message = f"the top level must be a mapping with a 'queues:' key, not {kind}"
        raise ConfigError(path, [Problem(yamlsrc.Pos(1, 1), (), message)])

    problems = [Problem(doc.value_pos(p), p, message) for p, message in expand_errors]
    unexpanded = {p for p, _ in expand_errors}
    problems += [p for p in validation.schema_problems(doc) if p.path not in unexpanded]
    # Check further every queue whose own settings (and the defaults) passed the schema, so
    # one run of `jobd validate` reports every problem in the file.
    data = doc.data
    queues: dict[str, QueueConfig] = {}
    defaults_ok = not any(p.path[:1] == ("defaults",) for p in problems)
    if isinstance(data.get("queues"), dict) and defaults_ok:
        broken = {p.path[1] for p in problems if p.path[:1] == ("queues",) and len(p.path) > 1}
        base_dir = str(Path(path).resolve().parent)
        base_env = base_environment(environ)
        for name, raw in data["queues"].items():
            if name in broken:
                continue
            merged, origins = merge_defaults(data.get("defaults") or {}, raw)
            located = validation.Located(doc, ("queues", name), origins)
            if "command" not in merged:
                message = "'command' is required; set it here or in defaults"
                problems.append(located.problem((), message))
                continue
            queues[name] = build_queue(name, merged, base_dir, base_env)
            problems += validation.queue_problems(queues[name], located)
    cluster = isinstance(data.get("redis"), dict) and "cluster" in data["redis"]
    problems += validation.cross_queue_problems(queues, doc, cluster)
    if problems:
        raise ConfigError(path, problems)

    config_dir = str(Path(path).resolve().parent)
    redis_config = build_redis(data.get("redis") or {}, config_dir, environ)
    dashboard = build_dashboard(data.get("dashboard") or {}, config_dir, environ)
    for built in (redis_config, dashboard):
        if isinstance(built, tuple):
            where, message = built
            raise ConfigError(path, [Problem(doc.value_pos(where), where, message)])
    assert isinstance(redis_config, RedisConfig) and isinstance(dashboard, DashboardConfig)
    return Config(
        path=str(Path(path).resolve()),
        redis=redis_config,
        queues=MappingProxyType(queues),
        shutdown_grace=durations.parse(
            data.get("shutdown_grace", validation.TOP_DEFAULTS["shutdown_grace"])
        ),
        metrics_listen=(data.get("metrics") or {}).get("listen"),
        dashboard=dashboard,
    )


def build_redis(
    redis: dict[str, Any], base_dir: str, environ: Mapping[str, str]
) -> RedisConfig | tuple[yamlsrc.Path, str]:
    """The Redis settings, with the password read from wherever it is kept; or what is wrong
    (the path of the key, and a message)."""
    where = [k for k in ("url", "embedded", "cluster", "sentinel") if k in redis]
    if len(where) > 1:
        return ("redis", where[1]), f"give one of redis.{', redis.'.join(where)}, not several"
    url_problem = validation.url_problem(redis["url"]) if "url" in redis else None
    if url_problem:
        return ("redis", "url"), url_problem
    password = _secret(redis, ("redis",), base_dir, environ)
    if isinstance(password, tuple):
        return password
    tls = redis.get("tls", {})
    if tls and ("cluster" in redis or "sentinel" in redis):
        return ("redis", "tls"), (
            "TLS is supported with redis.url (rediss://) only, not yet with a cluster or "
            "Sentinel; reach those over a private network or a TLS tunnel"
        )
    embedded = None
    if not where or where == ["embedded"]:
        options = redis.get("embedded") or {}
        state = environ.get("STATE_DIRECTORY", "").split(":")[0] or os.path.join(base_dir, ".jobd")
        embedded = EmbeddedConfig(
            dir=os.path.join(base_dir, options["dir"]) if "dir" in options else state,
            appendfsync=options.get("appendfsync", "everysec"),
        )
    sentinel = None
    if "sentinel" in redis:
        section = redis["sentinel"]
        sentinel_password = _secret(section, ("redis", "sentinel"), base_dir, environ)
        if isinstance(sentinel_password, tuple):
            return sentinel_password
        sentinel = SentinelConfig(
            master=section["master"],
            nodes=tuple(parse_node(n) for n in section["nodes"]),
            db=section.get("db", 0),
            username=section.get("username"),
            password=sentinel_password,
        )
    cluster = redis.get("cluster")
    return RedisConfig(
        url=embedded.url if embedded else redis.get("url", ""),
        embedded=embedded,
        cluster=tuple(parse_node(n) for n in cluster["nodes"]) if cluster else None,
        sentinel=sentinel,
        username=redis.get("username"),
        password=password,
        tls=TLS(
            **{k: os.path.join(base_dir, v) for k, v in tls.items() if k.endswith("_file")},
            verify_hostname=tls.get("verify_hostname", True),
        ),
    )


def build_dashboard(
    section: dict[str, Any], base_dir: str, environ: Mapping[str, str]
) -> DashboardConfig | tuple[yamlsrc.Path, str]:
    """The dashboard's settings, with its token read; or what is wrong."""
    token = _secret(section, ("dashboard",), base_dir, environ, "token")
    if isinstance(token, tuple):
        return token
    if section.get("actions") and not token:
        return ("dashboard", "actions"), (
            "actions need a token: set dashboard.token_file or dashboard.token_credential"
        )
    return DashboardConfig(
        actions=bool(section.get("actions", False)),
        token=token,
        show_payloads=bool(section.get("show_payloads", False)),
        allowed_hosts=tuple(section.get("allowed_hosts") or ()),
    )


def _secret(
    section: dict[str, Any],
    path: yamlsrc.Path,
    base_dir: str,
    environ: Mapping[str, str],
    name: str = "password",
) -> str | tuple[yamlsrc.Path, str] | None:
    """A secret given in ``section`` as NAME, NAME_file or NAME_credential (a systemd
    credential); or what is wrong."""
    sources = [k for k in (name, f"{name}_file", f"{name}_credential") if k in section]
    if len(sources) > 1:
        return (*path, sources[1]), f"give one of {', '.join(sources)}, not several"
    if f"{name}_file" in section:
        secret_path = os.path.join(base_dir, section[f"{name}_file"])
    elif f"{name}_credential" in section:
        directory = environ.get("CREDENTIALS_DIRECTORY")
        if not directory:
            return (*path, f"{name}_credential"), (
                "CREDENTIALS_DIRECTORY is not set: run jobd under systemd with "
                f"LoadCredential={section[f'{name}_credential']}:/path/to/secret"
            )
        secret_path = os.path.join(directory, section[f"{name}_credential"])
    else:
        return section.get(name)
    try:
        return Path(secret_path).read_text().rstrip("\r\n")
    except OSError as exc:
        return (*path, sources[0]), f"cannot read {secret_path}: {exc.strerror}"


def merge_defaults(
    defaults: dict[str, Any], queue: dict[str, Any]
) -> tuple[dict[str, Any], dict[yamlsrc.Path, yamlsrc.Path]]:
    """``defaults`` under ``queue``, mappings merged key by key, lists and scalars replaced.

    Also returns, for each merged path that came from ``defaults``, its path in the file.
    """
    origins: dict[yamlsrc.Path, yamlsrc.Path] = {}

    def merge(low: Any, high: Any, path: yamlsrc.Path) -> Any:
        if not (isinstance(low, dict) and isinstance(high, dict)):
            return high
        result = dict(high)
        for key, value in low.items():
            if key in high:
                result[key] = merge(value, high[key], (*path, key))
            else:
                result[key] = value
                origins[(*path, key)] = ("defaults", *path, key)
        return result

    return merge(defaults, queue, ()), origins


def build_queue(
    name: str, q: dict[str, Any], base_dir: str, base_env: Mapping[str, str]
) -> QueueConfig:
    """A QueueConfig from a schema-valid, defaults-merged queue mapping.

    Every default not derived from another value comes from ``schema.json``'s ``default``s.
    """
    q, _ = merge_defaults(validation.QUEUE_DEFAULTS, q)
    stream = q.get("stream", f"jobd:{name}")
    lease, retry, dead, limits = q["lease"], q["retry"], q["dead_letter"], q.get("limits", {})
    dedupe = q.get("dedupe") or {}
    queue_keys = keys.QueueKeys.of(stream, dead.get("stream"))
    command = list(q["command"])
    if "/" in command[0]:
        command[0] = os.path.normpath(os.path.join(base_dir, command[0]))
    env = dict(base_env)
    run_as_user = q.get("run_as", {}).get("user")
    if run_as_user:  # the handler's own identity, not the daemon's (root's)
        with contextlib.suppress(KeyError):  # an unknown user is reported by validation
            account = pwd.getpwnam(run_as_user)
            env.update(HOME=account.pw_dir, USER=account.pw_name, LOGNAME=account.pw_name)
    env.update(q.get("env", {}))  # text, exactly as written (validation.is_text)
    process_limits = Limits(
        address_space=sizes.parse(limits["address_space"]) if "address_space" in limits else None,
        open_files=limits.get("open_files"),
        cpu_time=max(1, round(durations.parse(limits["cpu_time"])))
        if "cpu_time" in limits
        else None,
    )
    program = command[0] if "/" in command[0] else shutil.which(command[0], path=env.get("PATH"))
    argv = (program or command[0], *command[1:])  # found on the handler's PATH now, once
    if process_limits.prlimit_args():
        prlimit = shutil.which("prlimit") or "prlimit"
        argv = (prlimit, *process_limits.prlimit_args(), "--", *command)
    queue = QueueConfig(
        name=name,
        stream=stream,
        group=q["group"],
        command=tuple(command),
        argv=argv,
        concurrency=q["concurrency"],
        timeout=durations.parse(q["timeout"]),
        kill_grace=durations.parse(q["kill_grace"]),
        cwd=os.path.normpath(os.path.join(base_dir, q.get("cwd", "."))),
        env=MappingProxyType(env),
        lease=Lease(
            renew_every=durations.parse(lease["renew_every"]),
            reclaim_after=durations.parse(lease["reclaim_after"]),
        ),
        retry=Retry(
            max_attempts=retry["max_attempts"],
            backoff=durations.parse(retry["backoff"]),
            max_backoff=durations.parse(retry["max_backoff"]),
            jitter=float(retry["jitter"]),
        ),
        fail_exit_codes=frozenset(q["exit_codes"]["fail"]),
        max_deliveries=q["max_deliveries"],
        dead_letter=DeadLetter(
            stream=queue_keys.dead_letter,
            maxlen=dead["maxlen"],
            max_age=durations.parse(dead["max_age"]) if "max_age" in dead else None,
        ),
        retention_maxlen=q.get("retention", {}).get("maxlen"),
        max_payload=sizes.parse(q["max_payload"]),
        limits=process_limits,
        run_as_user=q.get("run_as", {}).get("user"),
        run_as_group=q.get("run_as", {}).get("group"),
        log_payload=q["log_payload"],
        dedupe_window=durations.parse(dedupe["window"]) if "window" in dedupe else None,
        schedule=tuple(build_schedule(s) for s in q.get("schedule", [])),
        slots=limits.get("concurrency"),
        rate=build_rate(limits),
        starvation_after=(
            durations.parse(q["starvation_after"]) if "starvation_after" in q else None
        ),
        keys=queue_keys,
    )
    return with_levels(queue, q.get("priorities"), q.get("default_priority"))


def with_levels(queue: QueueConfig, names: list[str] | None, default: str | None) -> QueueConfig:
    """The queue with its priority levels; the default level (the last unless named) reads
    the queue's own stream."""
    if not names:
        return queue
    default = default or names[-1]

    def level(name: str) -> QueueConfig:
        if name == default:
            return replace(queue, priority=name)
        level_keys = queue.keys.level(name)
        return replace(queue, priority=name, stream=level_keys.stream, keys=level_keys)

    return replace(queue, priority=default, levels=tuple(level(name) for name in names))


def build_rate(limits: dict[str, Any]) -> Rate | None:
    if "rate" not in limits:
        return None
    count, _, per = limits["rate"].partition("/")
    return Rate(int(count), durations.parse(per), limits.get("burst", int(count)))


def build_schedule(entry: dict[str, Any]) -> ScheduleConfig:
    raw = entry.get("payload", "")
    payload = raw.encode() if isinstance(raw, str) else orjson.dumps(raw)
    timezone = entry.get("timezone", "UTC")
    name = entry.get("name")
    if name is None:  # stable while the entry is unchanged, wherever it sits in the list
        digest = hashlib.sha1(f"{entry['cron']}|{timezone}|".encode() + payload).hexdigest()
        name = f"cron-{digest[:8]}"
    return ScheduleConfig(
        name=name,
        cron=entry["cron"],
        timezone=timezone,
        payload=payload,
        catch_up=durations.parse(entry.get("catch_up", "1m")),
    )
