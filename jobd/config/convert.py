"""Converters: a config value as written → its typed value, or ValueError saying what is wrong.

The checks call them to find problems, the build calls them on values known good; durations and
sizes have their own modules (``durations``, ``sizes``). ``Invalid`` is the ValueError of a
value the schema cannot judge (a URL that does not read as written, a secret that cannot be
read); it names the key at fault when the value is a group of keys.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from jobd.config import durations, sizes
from jobd.config.redact import NOT_SHOWN
from jobd.config.schema import SCHEDULE_DEFAULTS
from jobd.config.types import Node, Rate, Resources, ScheduleConfig


class Invalid(ValueError):
    """What is wrong with a value; ``key``: which key of a group of keys is at fault."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


def node(text: str) -> Node:
    """``HOST:PORT`` or ``[IPV6]:PORT`` (the schema has checked the form)."""
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def rate(text: str, burst: int | None = None) -> Rate:
    """``COUNT/DURATION`` (``100/1m``); the burst defaults to the count."""
    count, _, per = text.partition("/")
    return Rate(int(count), durations.parse(per), int(count) if burst is None else burst)


RESOURCES = ("memory", "pids", "cpu", "address_space", "open_files", "cpu_time", "oom_score_adj")


def resources(given: Mapping[str, Any]) -> Resources:
    """A queue's ``resources`` (the keys given; the schema's default for ``oom_score_adj``)."""
    cpu_time, memory, space = (given.get(k) for k in ("cpu_time", "memory", "address_space"))
    return Resources(
        memory=None if memory is None else sizes.parse(memory),
        pids=given.get("pids"),
        cpu=None if given.get("cpu") is None else float(given["cpu"]),
        address_space=None if space is None else sizes.parse(space),
        open_files=given.get("open_files"),
        cpu_time=None if cpu_time is None else max(1, round(durations.parse(cpu_time))),
        oom_score_adj=given.get("oom_score_adj", 500),
    )


def schedule(entry: Mapping[str, Any]) -> ScheduleConfig:
    """One ``schedule`` entry; its name, unless given, is derived from what it enqueues."""
    entry = {**SCHEDULE_DEFAULTS, **entry}
    raw = entry["payload"]
    payload = raw.encode() if isinstance(raw, str) else orjson.dumps(raw)
    name = entry.get("name")
    if name is None:  # stable while the entry is unchanged, wherever it sits in the list
        key = f"{entry['cron']}|{entry['timezone']}|".encode() + payload
        name = f"cron-{hashlib.sha1(key).hexdigest()[:8]}"
    return ScheduleConfig(
        name=name,
        cron=entry["cron"],
        timezone=entry["timezone"],
        payload=payload,
        catch_up=durations.parse(entry["catch_up"]),
    )


def url(text: str) -> str:
    """A Redis URL that reads as written (a password's '/' would make the rest of it a port,
    shown in redis-py's errors)."""
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018  (raises ValueError when it is not a number)
    except ValueError:
        pass
    else:
        if "@" not in parts.path + parts.query + parts.fragment:
            return text
    raise Invalid(
        "cannot be read as written: its port is not a number, or its user name or password "
        "holds '/', '?', '#' or '@', which must be percent-encoded there (%2F, %3F, %23, %40) "
        + NOT_SHOWN
    )


def secret_keys(name: str) -> tuple[str, str, str]:
    """The keys a secret may be given as: itself, a file, a systemd credential."""
    return name, f"{name}_file", f"{name}_credential"


def secret(
    given: Mapping[str, Any], name: str, base_dir: str, environ: Mapping[str, str]
) -> str | None:
    """The secret ``name``, from whichever of ``secret_keys(name)`` ``given`` holds (a file is
    relative to ``base_dir``); None when none is given."""
    written, file_key, credential_key = secret_keys(name)
    sources = [k for k in secret_keys(name) if k in given]
    if len(sources) > 1:
        raise Invalid(f"give one of {', '.join(sources)}, not several", sources[1])
    if file_key in given:
        secret_path = os.path.join(base_dir, given[file_key])
    elif credential_key in given:
        directory = environ.get("CREDENTIALS_DIRECTORY")
        if not directory:
            raise Invalid(
                "CREDENTIALS_DIRECTORY is not set: run jobd under systemd with "
                f"LoadCredential={given[credential_key]}:/path/to/secret",
                credential_key,
            )
        secret_path = os.path.join(directory, given[credential_key])
    else:
        return given.get(written)
    try:
        return Path(secret_path).read_text().rstrip("\r\n")
    except OSError as exc:
        raise Invalid(f"cannot read {secret_path}: {exc.strerror}", sources[0]) from None
    except UnicodeDecodeError:
        raise Invalid(f"cannot read {secret_path}: it is not UTF-8 text", sources[0]) from None
