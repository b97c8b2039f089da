"""What is wrong with a config, each problem with its position and a hint to fix it.

Two layers: the JSON Schema in ``schema.json`` (types, ranges, unknown keys, durations) and the
checks a schema cannot express (lease timing, stream collisions, executables on disk).
"""

from __future__ import annotations

import difflib
import grp
import json
import os
import pwd
import re
import shutil
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import jsonschema
from croniter import croniter
from redis.crc import key_slot

from jobd import durations, keys
from jobd.yamlsrc import Document, Path, Pos

if TYPE_CHECKING:
    from jobd.config import QueueConfig

# A lease must survive this many missed renewals before another consumer may take the job.
RENEWALS_PER_RECLAIM = 3

# Keys whose values may be secrets: no message echoes them, nor a mapping or list holding one.
SECRET_KEYS = frozenset({"password", "token", "url"})
# A scalar written where one of these sections belongs may well be a URL or a token.
SECRET_SECTIONS = frozenset({("redis",), ("dashboard",)})
NOT_SHOWN = "(the value is not shown: it may be a secret)"


@dataclass(frozen=True, order=True)
class Problem:
    pos: Pos
    path: Path = field(compare=False)
    message: str = field(compare=False)

    def __post_init__(self) -> None:  # defence in depth: no URL's credentials, wherever quoted
        object.__setattr__(self, "message", redact_urls(self.message))

    @classmethod
    def whole_file(cls, message: str) -> Problem:
        return cls(Pos(0, 0), (), message)

    def dotted(self) -> str:
        return ".".join(_component(p) for p in self.path)

    def format(self, filename: str) -> str:
        where = f"{filename}:{self.pos.line}:{self.pos.col}" if self.pos.line else filename
        what = f"{self.dotted()}: {self.message}" if self.path else self.message
        return f"{where}: error: {what}"

    def as_json(self) -> dict[str, Any]:
        return {
            "line": self.pos.line or None,
            "column": self.pos.col or None,
            "path": self.dotted(),
            "message": self.message,
        }


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]*")
_PARAM = re.compile(r"([?&;])([^=&;#?]*)=([^&;]*)")
_SECRET_PARAM = re.compile(r"pass|token|secret|cred|auth", re.IGNORECASE)


def redact_url(url: str) -> str:
    """``url`` with its credentials as ``***``: the password of its userinfo (all of a userinfo
    without one: it may be a token), and query parameters such as ``?password=``."""
    url = _PARAM.sub(_mask_param, url)
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not sep or not at:
        return url
    user, colon, _ = userinfo.partition(":")
    shown = f"{user}:" if colon and not set("/?#") & set(user) else ""
    return f"{scheme}{sep}{shown}***@{host}"


def _mask_param(match: re.Match[str]) -> str:
    sep, name, _ = match.groups()
    return f"{sep}{name}=***" if _SECRET_PARAM.search(unquote(name)) else match.group(0)


def redact_urls(text: str) -> str:
    """``text`` with every URL in it redacted (``redact_url``)."""
    return _URL.sub(lambda m: redact_url(m.group(0)), text)


def url_problem(url: str) -> str | None:
    """What keeps ``url`` from being read as written (a password's '/' would make the rest of
    it a port, shown in redis-py's errors); None when it reads."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError when it is not a number)
    except ValueError:
        pass
    else:
        if "@" not in parts.path + parts.query + parts.fragment:
            return None
    return (
        "cannot be read as written: its port is not a number, or its user name or password "
        "holds '/', '?', '#' or '@', which must be percent-encoded there (%2F, %3F, %23, %40) "
        + NOT_SHOWN
    )


def is_secret(path: Path) -> bool:
    """Whether the value at ``path`` may be a secret, never to be echoed: a password, token or
    URL, a handler's environment, or a scalar standing where ``redis`` or ``dashboard`` belongs."""
    if path in SECRET_SECTIONS or (path and path[-1] in SECRET_KEYS):
        return True
    return path[:2] == ("defaults", "env") or (path[:1] == ("queues",) and path[2:3] == ("env",))


def _holds_secret(doc: Document, path: Path) -> bool:
    """Whether the value at ``path`` is a secret or holds one."""
    n = len(path)
    return is_secret(path) or any(p[:n] == path and is_secret(p) for p in doc.values)


def _component(part: str | int) -> str:
    """A path component as written, or quoted when it holds anything unprintable."""
    text = str(part)
    return text if text.isprintable() and text.strip() == text and text else repr(text)


@cache
def schema() -> dict[str, Any]:
    return json.loads(resources.files("jobd").joinpath("schema.json").read_text("utf-8"))


def schema_text() -> str:
    return resources.files("jobd").joinpath("schema.json").read_text("utf-8")


def _defaults_of(node: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, prop in node.get("properties", {}).items():
        if "default" in prop:
            result[key] = prop["default"]
        elif prop.get("type") == "object" and "properties" in prop:
            result[key] = _defaults_of(prop)
    return result


QUEUE_DEFAULTS = _defaults_of(schema()["$defs"]["queue"])
TOP_DEFAULTS = _defaults_of(schema())


def is_text(path: Path) -> bool:
    """Whether the value at ``path`` is text (schema type ``string``, or ``x-text``): taken
    exactly as written or as ``${VAR}`` expands, never read as a YAML number, boolean or null."""
    node = _schema_at(path)
    return node is not None and (node.get("type") == "string" or bool(node.get("x-text")))


def _schema_at(path: Path) -> dict[str, Any] | None:
    node: Any = schema()
    for part in path:
        node = _deref(node)
        if isinstance(part, int):
            node = node.get("items")
        else:
            node = node.get("properties", {}).get(part, node.get("additionalProperties"))
        if not isinstance(node, dict):
            return None
    return _deref(node)


def _deref(node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    return schema()["$defs"][ref.rsplit("/", 1)[1]] if ref else node


def schema_problems(doc: Document) -> list[Problem]:
    validator = jsonschema.Draft202012Validator(schema())
    problems: list[Problem] = []
    for error in validator.iter_errors(doc.data):
        problems += _translate(error, doc)
    return problems


def _translate(error: jsonschema.ValidationError, doc: Document) -> list[Problem]:
    path: Path = tuple(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = sorted(error.schema.get("properties", {}))
        extra = [k for k in error.instance if k not in allowed]
        return [_unknown_key(doc, path, key, allowed) for key in extra]
    if error.validator == "propertyNames":
        bad = error.instance
        hint = error.schema.get("propertyNames", {}).get("x-hint", "")
        return [Problem(doc.key_pos((*path, bad)), path, f"invalid name {bad!r}; {hint}")]
    if error.validator == "required":
        return [Problem(doc.key_pos(path), path, error.message)]
    message = error.message
    if _holds_secret(doc, path):
        message = _without_value(error)
    elif error.validator in ("type", "pattern") and "x-hint" in error.schema:
        message = f"{error.instance!r} is not valid here; {error.schema['x-hint']}"
    elif "x-hint" in error.schema:
        message = f"{message}; {error.schema['x-hint']}"
    return [Problem(doc.value_pos(path), path, message)]


def _without_value(error: jsonschema.ValidationError) -> str:
    """The schema's complaint in words that do not quote the value."""
    if error.validator == "type":
        expected = "string" if error.schema.get("x-text") else error.validator_value
        names = expected if isinstance(expected, list) else [expected]
        what = f"must be {' or '.join(map(_a_kind, names))}, not {kind_of(error.instance)}"
    elif error.validator == "minLength":
        what = f"must be at least {error.validator_value} characters long"
    else:
        what = "is not valid here"
    hint = error.schema.get("x-hint")
    return f"{what}; {hint} {NOT_SHOWN}" if hint else f"{what} {NOT_SHOWN}"


def _a_kind(json_type: str) -> str:
    return {"object": "a mapping", "array": "a list", "integer": "an integer"}.get(
        json_type, f"a {json_type}"
    )


def kind_of(value: Any) -> str:
    """What ``value`` is, in words that do not quote it."""
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return {dict: "a mapping", list: "a list"}.get(type(value), "a string")


def _unknown_key(doc: Document, path: Path, key: str, allowed: list[str]) -> Problem:
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    if close:
        hint = f"did you mean {close[0]!r}?"
    else:
        hint = f"expected one of: {', '.join(allowed)}"
    return Problem(doc.key_pos((*path, key)), (*path, key), f"unknown key {key!r}; {hint}")


@dataclass(frozen=True)
class Located:
    """Positions for one queue's merged settings, following values inherited from defaults."""

    doc: Document
    prefix: Path
    origins: dict[Path, Path]

    def problem(self, sub: Path, message: str) -> Problem:
        path = (*self.prefix, *sub)
        for i in range(len(sub), 0, -1):
            if sub[:i] in self.origins:
                where = self.doc.value_pos((*self.origins[sub[:i]], *sub[i:]))
                return Problem(where, path, f"{message} (value set in defaults)")
        if sub and path in self.doc.values:
            where = self.doc.value_pos(path)
        else:
            # The queue as a whole, or a built-in default: the nearest key the user wrote.
            where = self.doc.key_pos(path)
        return Problem(where, path, message)


def queue_problems(q: QueueConfig, at: Located) -> list[Problem]:
    problems: list[Problem] = []
    for sub, seconds in (
        (("timeout",), q.timeout),
        (("lease", "renew_every"), q.lease.renew_every),
        (("lease", "reclaim_after"), q.lease.reclaim_after),
        (("dedupe", "window"), q.dedupe_window),
        (("limits", "rate"), q.rate.per if q.rate else None),
        (("starvation_after",), q.starvation_after),
    ):
        if seconds is None:
            continue
        if seconds <= 0:
            problems.append(at.problem(sub, "must be longer than zero"))
    if q.lease.renew_every * RENEWALS_PER_RECLAIM > q.lease.reclaim_after + 1e-9:
        limit = durations.format(q.lease.reclaim_after / RENEWALS_PER_RECLAIM)
        problems.append(
            at.problem(
                ("lease", "renew_every"),
                f"{durations.format(q.lease.renew_every)} is not well below lease.reclaim_after "
                f"({durations.format(q.lease.reclaim_after)}): a lease must survive "
                f"{RENEWALS_PER_RECLAIM - 1} missed renewals; set renew_every to {limit} or less",
            )
        )
    if q.retry.max_backoff < q.retry.backoff:
        problems.append(
            at.problem(("retry", "max_backoff"), "is shorter than retry.backoff; raise it")
        )
    if q.dead_letter.stream == q.stream:
        problems.append(
            at.problem(
                ("dead_letter", "stream"),
                f"the dead-letter stream is the queue's own stream {q.stream!r}; "
                "dead letters would run again: name another stream",
            )
        )
    problems += _command_problems(q, at)
    problems += _privilege_problems(q, at)
    problems += _schedule_problems(q, at)
    names = [str(level.priority) for level in q.levels]
    if q.levels and q.priority not in names:
        problems.append(
            at.problem(
                ("default_priority",),
                f"{q.priority!r} is not one of the queue's priorities ({', '.join(names)})",
            )
        )
    if not os.path.isdir(q.cwd):
        problems.append(at.problem(("cwd",), f"{q.cwd!r} is not an existing directory"))
    return problems


def _command_problems(q: QueueConfig, at: Located) -> list[Problem]:
    program = q.command[0]
    if "/" in program:
        if not os.path.exists(program):
            return [at.problem(("command", 0), f"{program!r} does not exist")]
        if os.path.isdir(program):
            return [at.problem(("command", 0), f"{program!r} is a directory")]
        if not os.access(program, os.X_OK):
            return [
                at.problem(
                    ("command", 0),
                    f"{program!r} is not executable; run chmod +x on it, or name its "
                    "interpreter first, e.g. [python3, script.py]",
                )
            ]
        return []
    if shutil.which(program, path=q.env.get("PATH")) is None:
        return [
            at.problem(
                ("command", 0),
                f"{program!r} is not found on the handler's PATH ({q.env.get('PATH')}); "
                "give its full path, or set env.PATH",
            )
        ]
    return []


def _schedule_problems(q: QueueConfig, at: Located) -> list[Problem]:
    problems = []
    names: set[str] = set()
    for i, s in enumerate(q.schedule):
        if not croniter.is_valid(s.cron):
            problems.append(
                at.problem(
                    ("schedule", i, "cron"),
                    f"{s.cron!r} is not a cron expression: write five fields (minute hour day "
                    "month weekday), or six with seconds last, e.g. '*/5 * * * *'",
                )
            )
        try:
            ZoneInfo(s.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            problems.append(
                at.problem(
                    ("schedule", i, "timezone"),
                    f"no time zone {s.timezone!r}; write an IANA name such as UTC or Europe/Berlin",
                )
            )
        if s.name in names:
            problems.append(
                at.problem(
                    ("schedule", i),
                    f"a second schedule named {s.name!r} (same name, or the same cron, time zone "
                    "and payload): each tick would be enqueued once for both; give it a name",
                )
            )
        names.add(s.name)
        if s.catch_up <= 0:
            problems.append(at.problem(("schedule", i, "catch_up"), "must be longer than zero"))
    return problems


def _privilege_problems(q: QueueConfig, at: Located) -> list[Problem]:
    problems = []
    if q.run_as_group and not q.run_as_user:
        problems.append(
            at.problem(
                ("run_as",),
                "a group alone would leave handlers running as root, with every capability; "
                "name the user they run as too, e.g. run_as: {user: jobs, group: media}",
            )
        )
    if (q.run_as_user or q.run_as_group) and os.geteuid() != 0:
        problems.append(
            at.problem(("run_as",), "switching user or group needs jobd to run as root")
        )
    for kind, name, lookup in (("user", q.run_as_user, pwd.getpwnam),
                               ("group", q.run_as_group, grp.getgrnam)):  # fmt: skip
        if name is None:
            continue
        try:
            lookup(name)
        except KeyError:
            problems.append(at.problem(("run_as", kind), f"no {kind} {name!r} on this host"))
    if q.limits.prlimit_args() and shutil.which("prlimit") is None:
        problems.append(at.problem(("limits",), "limits need prlimit(1) (util-linux) on PATH"))
    return problems


def cross_queue_problems(
    queues: dict[str, QueueConfig], doc: Document, cluster: bool = False
) -> list[Problem]:
    problems: list[Problem] = _shared_dead_letter_problems(queues, doc)
    seen: dict[tuple[str, str], str] = {}
    streams = {q.stream: q.name for q in queues.values()}
    for q in queues.values():
        where = doc.key_pos(("queues", q.name))
        other = seen.setdefault((q.stream, q.group), q.name)
        if other != q.name:
            problems.append(
                Problem(
                    where,
                    ("queues", q.name),
                    f"reads stream {q.stream!r} with group {q.group!r} like queue {other!r}; "
                    "two queues would take each other's jobs: use another stream or group",
                )
            )
        owner = streams.get(q.dead_letter.stream)
        if owner is not None and owner != q.name:
            problems.append(
                Problem(
                    where,
                    ("queues", q.name, "dead_letter", "stream"),
                    f"the dead-letter stream {q.dead_letter.stream!r} is the stream of queue "
                    f"{owner!r}; dead letters would run there: name another stream",
                )
            )
        if cluster and not keys.can_derive(q.stream):
            at = ("queues", q.name, "stream")
            problems.append(
                Problem(
                    doc.value_pos(at),
                    at,
                    f"the stream {q.stream!r} has a '}}' but no {{hash tag}}, so its other keys "
                    f"cannot share its Redis Cluster slot: give it a hash tag, e.g. "
                    f"'{{{q.stream.replace('}', '')}}}'",
                )
            )
        elif cluster and key_slot(q.dead_letter.stream.encode()) != key_slot(q.stream.encode()):
            dead = ("queues", q.name, "dead_letter", "stream")
            problems.append(
                Problem(
                    doc.value_pos(dead),
                    dead,
                    f"the dead-letter stream {q.dead_letter.stream!r} is in another Redis Cluster "
                    f"slot than the stream {q.stream!r}; one script writes both: name it "
                    f"{keys.derive(q.stream, 'dead')!r} (the default) or give both one hash tag",
                )
            )
    return problems


def _shared_dead_letter_problems(queues: dict[str, QueueConfig], doc: Document) -> list[Problem]:
    """A dead-letter stream written by two queues on different streams: `jobd dlq` on one
    would list and purge the other's records, and requeue its jobs into its own stream, where
    its own command runs them. Queues reading one stream with two groups are left alone: each
    group gets every job of that stream anyway, and their default is the same derived name."""
    problems: list[Problem] = []
    first: dict[str, QueueConfig] = {}
    for q in queues.values():
        other = first.setdefault(q.dead_letter.stream, q)
        if other.stream != q.stream:
            problems.append(_shared_dead_letter(q, other, doc))
    return problems


def _shared_dead_letter(q: QueueConfig, other: QueueConfig, doc: Document) -> Problem:
    path = ("queues", q.name, "dead_letter", "stream")
    where, set_in = _written_at(doc, path)
    own = keys.derive(q.stream, "dead")
    hint = f"name another, e.g. {own!r} (the default)"
    if own == q.dead_letter.stream:  # the other queue named this one's default by hand
        hint = f"name another for queue {other.name!r}"
    return Problem(
        where,
        path,
        f"the dead-letter stream {q.dead_letter.stream!r} is queue {other.name!r}'s too{set_in}; "
        "`jobd dlq` would list and purge either queue's records, and requeue the other's jobs "
        f"into this queue's stream to run under its command: {hint}",
    )


def _written_at(doc: Document, path: Path) -> tuple[Pos, str]:
    """Where the value at ``path`` (a queue's) is written: in the queue, in ``defaults``
    (then also a note saying so), or nowhere (a derived default: the queue's key)."""
    if path in doc.values:
        return doc.values[path], ""
    in_defaults = ("defaults", *path[2:])
    if in_defaults in doc.values:
        return doc.values[in_defaults], " (value set in defaults)"
    return doc.key_pos(path[:2]), ""
