"""The typed Config, built from a document that passed every check (``validation``).

Nothing here judges a value: each is converted (``convert``, ``durations``, ``sizes``) or
derived (``QueueSettings``) by the same code the checks ran. Only a secret is read again, and
a secret file that went away since it was checked is a ConfigError still.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path as FilePath
from types import MappingProxyType

from jobd.config import chains, convert, durations, sizes
from jobd.config.problems import ConfigError
from jobd.config.queue_settings import QueueSettings
from jobd.config.schema import TOP_DEFAULTS
from jobd.config.types import (
    TLS,
    Config,
    DashboardConfig,
    DeadLetter,
    History,
    Lease,
    QueueConfig,
    RedisConfig,
    Resources,
    Retry,
    SentinelConfig,
    TracingConfig,
)
from jobd.config.view import ConfigView
from jobd.config.yamlsrc import Path
from jobd.embedded import EmbeddedConfig


def build(view: ConfigView, queues: Mapping[str, QueueSettings]) -> Config:
    """The Config of a checked file: ``view`` and its ``queues`` have no problem left."""
    assert not view.problems, "build only what passed the checks"
    return Config(
        path=str(FilePath(view.source.path).resolve()),
        redis=build_redis(view),
        queues=MappingProxyType(
            {name: chains.attach(build_queue(q), q, queues) for name, q in queues.items()}
        ),
        shutdown_grace=durations.parse(
            view.get(("shutdown_grace",), TOP_DEFAULTS["shutdown_grace"])
        ),
        metrics_listen=view.get(("metrics", "listen"), None),
        cgroup=view.get(("cgroup",), "auto"),
        dashboard=build_dashboard(view),
        processes=processes(view.get(("processes",), TOP_DEFAULTS["processes"])),
        tracing=build_tracing(view),
    )


def processes(value: int | str) -> int:
    """``processes``: a number, or ``auto``: one per CPU this process may run on (its CPU
    affinity: a container's cpuset or `taskset`), not every CPU of the machine."""
    return max(1, len(os.sched_getaffinity(0))) if value == "auto" else int(value)


def build_redis(view: ConfigView) -> RedisConfig:
    """Where Redis is and how to log in, the passwords read from wherever they are kept."""
    redis = view.get(("redis",), {})
    base_dir = view.source.base_dir
    embedded = None
    if not any(key in redis for key in ("url", "cluster", "sentinel")):
        embedded = _embedded(redis.get("embedded") or {}, view)
    cluster = redis.get("cluster")
    tls = redis.get("tls", {})
    return RedisConfig(
        url=embedded.url if embedded else redis.get("url", ""),
        embedded=embedded,
        cluster=tuple(convert.node(n) for n in cluster["nodes"]) if cluster else None,
        sentinel=_sentinel(view) if "sentinel" in redis else None,
        username=redis.get("username"),
        password=_secret(view, ("redis",), "password"),
        tls=TLS(
            **{k: os.path.join(base_dir, v) for k, v in tls.items() if k.endswith("_file")},
            verify_hostname=tls.get("verify_hostname", True),
        ),
    )


def _embedded(options: Mapping[str, str], view: ConfigView) -> EmbeddedConfig:
    """The server jobd runs itself: its state directory, by default systemd's or one next
    to the config."""
    base_dir = view.source.base_dir
    state = view.source.environ.get("STATE_DIRECTORY", "").split(":")[0]
    default = state or os.path.join(base_dir, ".jobd")
    return EmbeddedConfig(
        dir=os.path.join(base_dir, options["dir"]) if "dir" in options else default,
        appendfsync=options.get("appendfsync", "everysec"),
    )


def _sentinel(view: ConfigView) -> SentinelConfig:
    section = view.get(("redis", "sentinel"))
    return SentinelConfig(
        master=section["master"],
        nodes=tuple(convert.node(n) for n in section["nodes"]),
        db=section.get("db", 0),
        username=section.get("username"),
        password=_secret(view, ("redis", "sentinel"), "password"),
    )


def build_dashboard(view: ConfigView) -> DashboardConfig:
    section = view.get(("dashboard",), {})
    return DashboardConfig(
        actions=bool(section.get("actions", False)),
        token=_secret(view, ("dashboard",), "token"),
        show_payloads=bool(section.get("show_payloads", False)),
        allowed_hosts=tuple(section.get("allowed_hosts") or ()),
    )


def build_tracing(view: ConfigView) -> TracingConfig | None:
    """``tracing``: on with ``enabled: true``, or with an ``otlp_endpoint`` and no
    ``enabled: false``; None when the section is absent."""
    section = view.get(("tracing",), None)
    if section is None:
        return None
    endpoint = section.get("otlp_endpoint")
    return TracingConfig(
        enabled=bool(section.get("enabled", endpoint is not None)),
        otlp_endpoint=endpoint,
        service=section.get("service_name", "jobd"),
    )


def _secret(view: ConfigView, section: Path, name: str) -> str | None:
    try:
        return view.secret(section, name)
    except convert.Invalid as exc:  # readable when checked, gone now
        problem = view.problem((*section, str(exc.key)), str(exc))
        raise ConfigError(view.source.path, [problem]) from None


def build_queue(q: QueueSettings) -> QueueConfig:  # long: one line per setting, nothing else
    """The typed queue, with its priority levels."""
    queue_keys, command, env, resources = q.keys(), q.command(), q.env(), q.resources()
    queue = QueueConfig(
        name=q.name,
        stream=q.stream(),
        group=q.get("group"),
        command=command,
        argv=_argv(command, env, resources),
        concurrency=q.get("concurrency"),
        prefetch=None if q.get("prefetch") == "auto" else int(q.get("prefetch")),
        timeout=q.duration("timeout"),
        kill_grace=q.duration("kill_grace"),
        cwd=q.cwd(),
        env=MappingProxyType(env),
        lease=Lease(q.duration("lease", "renew_every"), q.duration("lease", "reclaim_after")),
        retry=Retry(
            max_attempts=q.get("retry", "max_attempts"),
            backoff=q.duration("retry", "backoff"),
            max_backoff=q.duration("retry", "max_backoff"),
            jitter=float(q.get("retry", "jitter")),
        ),
        fail_exit_codes=frozenset(q.get("exit_codes", "fail")),
        max_deliveries=q.get("max_deliveries"),
        dead_letter=DeadLetter(
            stream=queue_keys.dead_letter,
            maxlen=q.get("dead_letter", "maxlen"),
            max_age=q.optional_duration("dead_letter", "max_age"),
        ),
        history=History(
            max_age=q.duration("history", "max_age"),
            maxlen=q.get("history", "maxlen"),
            output=sizes.parse(q.get("history", "output")),
            events=q.get("history", "events"),
        ),
        retention_maxlen=_retention(q.get("retention", "maxlen")),
        max_payload=sizes.parse(q.get("max_payload")),
        result_max=sizes.parse(q.get("result_max")),
        max_follow_ups=int(q.get("max_follow_ups")),
        max_follow_ups_bytes=sizes.parse(q.get("max_follow_ups_bytes")),
        resources=resources,
        run_as_user=q.get("run_as", "user", default=None),
        run_as_group=q.get("run_as", "group", default=None),
        log_payload=q.get("log_payload"),
        dedupe_window=q.optional_duration("dedupe", "window"),
        schedule=q.schedule(),
        slots=q.get("limits", "concurrency", default=None),
        rate=q.rate(),
        starvation_after=q.optional_duration("starvation_after"),
        max_wait=q.optional_duration("max_wait"),
        keys=queue_keys,
        max_timeout=q.optional_duration("max_timeout"),
        watchdog=q.optional_duration("watchdog"),
        progress_from_output=bool(q.get("progress_from_output")),
    )
    return with_levels(queue, *q.priorities())


def _retention(maxlen: int | str) -> int | None:
    """``retention.maxlen``: None when the operator asked for ``unbounded``."""
    return None if maxlen == "unbounded" else int(maxlen)


def _argv(command: tuple[str, ...], env: Mapping[str, str], limits: Resources) -> tuple[str, ...]:
    """What is executed: the program found on the handler's PATH now, once; behind
    prlimit(1) when there are limits."""
    program = command[0] if "/" in command[0] else shutil.which(command[0], path=env.get("PATH"))
    if limits.prlimit_args():
        prlimit = shutil.which("prlimit") or "prlimit"
        return (prlimit, *limits.prlimit_args(), "--", *command)
    return (program or command[0], *command[1:])


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
