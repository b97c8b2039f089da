"""The config: one immutable, typed object built from the YAML file and passed down explicitly.

``load()`` runs the pipeline, each step in its own module:

1. parse (``source``): read the file, parse it with positions, expand ``${VAR}``;
2. check (``view``, ``queue_settings``, ``validation``): the schema's verdict on every
   value, each queue's settings merged with ``defaults`` once, then every check a schema
   cannot express, over the document as written: all problems of the file in one run;
3. build (``build``): the typed ``Config`` (``types``) from a document known good.

It returns the Config, or raises ``ConfigError`` carrying every problem found, each with its
line and column. The names other modules import (the config classes, ``ConfigError``) are
re-exported here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import replace

from jobd.config import build as config_build
from jobd.config import validation
from jobd.config.convert import node as parse_node
from jobd.config.problems import ConfigError, Problem
from jobd.config.queue_settings import queues_of
from jobd.config.source import parse, read_text
from jobd.config.types import (
    TLS,
    Config,
    DashboardConfig,
    DeadLetter,
    History,
    Lease,
    Node,
    QueueConfig,
    Rate,
    RedisConfig,
    Resources,
    Retry,
    ScheduleConfig,
    SentinelConfig,
    TracingConfig,
    format_node,
)
from jobd.config.view import ConfigView
from jobd.configpath import DEFAULT_CONFIG

__all__ = [
    "DEFAULT_CONFIG",
    "TLS",
    "Config",
    "ConfigError",
    "DashboardConfig",
    "DeadLetter",
    "History",
    "Lease",
    "Node",
    "Problem",
    "QueueConfig",
    "Rate",
    "RedisConfig",
    "Resources",
    "Retry",
    "ScheduleConfig",
    "SentinelConfig",
    "TracingConfig",
    "digest",
    "format_node",
    "load",
    "parse_node",
    "read_text",
]


def load(path: str, environ: Mapping[str, str] | None = None, text: str | None = None) -> Config:
    """The config at ``path`` (or ``text``, as read from there earlier), ``${VAR}`` expanded
    from ``environ`` (default: this process's environment); ConfigError with every problem of
    the file when it is invalid."""
    text = read_text(path) if text is None else text
    view = ConfigView.of(parse(path, environ, text))
    queues = queues_of(view)
    problems = validation.check(view, queues)
    if problems:
        raise ConfigError(path, problems)
    return replace(config_build.build(view, queues), digest=digest(text))


def digest(text: str) -> str:
    """What names a config's text (``Config.digest``)."""
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()
