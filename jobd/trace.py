"""A producer's W3C trace context on a job, carried to its handler (docs/producing.md, Traces).

A job may carry three plain fields, as any producer writes them (the names of the W3C headers,
which is also what an OpenTelemetry propagator's ``inject`` writes into a dict):

| field         | value                                            | the handler gets |
|---------------|--------------------------------------------------|------------------|
| traceparent   | ``00-<32 hex trace id>-<16 hex span id>-<2 hex>`` | TRACEPARENT      |
| tracestate    | W3C tracestate, at most 512 bytes                | TRACESTATE       |
| baggage       | W3C baggage, at most 8192 bytes                  | BAGGAGE          |

(OpenTelemetry's "Environment Variables as Context Propagation Carriers" names those
variables.) A value that does not follow its grammar is dropped (``Trace.dropped`` names it;
logged once per queue and field at INFO, later ones at DEBUG, and counted by the daemon), and the
job runs as if it had none: a producer's mistake never fails a job. A ``tracestate`` without a
usable ``traceparent`` is dropped too (it means nothing alone); ``baggage`` stands on its own.

A job with none of the three costs one lookup of each name when it is read, and nothing after:
``Job.trace`` is None.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger("jobd.job")

TRACEPARENT = b"traceparent"
TRACESTATE = b"tracestate"
BAGGAGE = b"baggage"
FIELDS = (TRACEPARENT, TRACESTATE, BAGGAGE)
KEYS = ("traceparent", "tracestate", "baggage")  # --ndjson keys, NewJob attributes
VARIABLES = {TRACEPARENT: "TRACEPARENT", TRACESTATE: "TRACESTATE", BAGGAGE: "BAGGAGE"}
MAX_TRACEPARENT = 512  # a later version may add fields; more than this is no traceparent
MAX_TRACESTATE = 512  # bytes: what W3C asks every platform to pass on at least
MAX_BAGGAGE = 8192  # bytes: W3C baggage's limit
MAX_STATE_MEMBERS = 32
MAX_BAGGAGE_MEMBERS = 180

# version 00 is exactly these four parts; a later version (not ff) may add "-..." after them.
# W3C leaves what follows to that version, so any visible ASCII is taken there (a header value's
# characters, less the space: fields are dash-separated), and nothing else: no control byte
# (a NUL cannot go into the handler's environment) and no byte that is not ASCII.
_TRACEPARENT = re.compile(
    rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[\x21-\x7e]*)?"
)
# What any kept value may hold, whatever its grammar says: visible ASCII, the space and the tab
# (baggage's optional white space). ``read`` checks it again before it decodes a value.
_SAFE = re.compile(rb"[\t\x20-\x7e]*")
_ZERO_TRACE, _ZERO_SPAN = b"0" * 32, b"0" * 16
_KEY_CHARS = rb"[a-z0-9_\-*/]"
_STATE_MEMBER = re.compile(
    rb"(?:[a-z]" + _KEY_CHARS + rb"{0,255}|[a-z0-9]" + _KEY_CHARS + rb"{0,240}@[a-z]"
    + _KEY_CHARS + rb"{0,13})=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)  # fmt: skip
_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_OWS = rb"[ \t]*"
_BAGGAGE_VALUE = rb"[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*"
_BAGGAGE_MEMBER = re.compile(
    _TOKEN + _OWS + b"=" + _OWS + _BAGGAGE_VALUE
    + b"(?:" + _OWS + b";" + _OWS + _TOKEN + b"(?:" + _OWS + b"=" + _OWS + _BAGGAGE_VALUE
    + b")?)*"
)  # fmt: skip
_SAID: set[tuple[str, bytes]] = set()  # (queue, field) whose dropped value was logged at INFO


@dataclass(frozen=True, slots=True)
class Trace:
    """A job's usable trace context (each None when absent or dropped), and the fields dropped."""

    traceparent: str | None = None
    tracestate: str | None = None
    baggage: str | None = None
    dropped: tuple[str, ...] = ()

    @property
    def trace_id(self) -> str | None:
        """The 32 hex digits of the trace this job belongs to, if it has a traceparent."""
        return None if self.traceparent is None else self.traceparent[3:35]

    @property
    def span_id(self) -> str | None:
        """The producer's span (the parent of what jobd and the handler do)."""
        return None if self.traceparent is None else self.traceparent[36:52]

    def environment(self, traceparent: str | None = None) -> dict[str, str]:
        """The handler's variables; ``traceparent`` instead of the producer's, when jobd made
        a span of its own for the attempt (``jobd.tracing``)."""
        env = {}
        if self.traceparent is not None:
            env["TRACEPARENT"] = traceparent or self.traceparent
            if self.tracestate is not None:
                env["TRACESTATE"] = self.tracestate
        if self.baggage is not None:
            env["BAGGAGE"] = self.baggage
        return env

    def kept(self, name: bytes) -> bool:
        """Whether the field ``name`` was usable (a retry carries only those)."""
        return name.decode() not in self.dropped


def valid_traceparent(raw: bytes) -> bool:
    """W3C traceparent: lowercase hex, version not ff, neither id all zeros; version 00 has
    nothing after its flags, a later version may have ``-`` and more visible ASCII."""
    if len(raw) > MAX_TRACEPARENT:
        return False
    match = _TRACEPARENT.fullmatch(raw)
    if match is None:
        return False
    version, trace_id, span_id, _, rest = match.groups()
    if version == b"ff" or trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return False
    return rest is None or version != b"00"


def valid_tracestate(raw: bytes) -> bool:
    """W3C tracestate: at most 32 comma-separated ``key=value`` members (empty ones allowed),
    each key once; at most MAX_TRACESTATE bytes."""
    if len(raw) > MAX_TRACESTATE:
        return False
    members = [m.strip(b" \t") for m in raw.split(b",")]
    members = [m for m in members if m]
    if len(members) > MAX_STATE_MEMBERS or not all(map(_STATE_MEMBER.fullmatch, members)):
        return False
    keys = [m.split(b"=", 1)[0] for m in members]
    return len(set(keys)) == len(keys)


def valid_baggage(raw: bytes) -> bool:
    """W3C baggage: 1 to 180 comma-separated ``key=value[;property…]`` members, at most
    MAX_BAGGAGE bytes."""
    if len(raw) > MAX_BAGGAGE:
        return False
    members = [m.strip(b" \t") for m in raw.split(b",")]
    return 0 < len(members) <= MAX_BAGGAGE_MEMBERS and all(map(_BAGGAGE_MEMBER.fullmatch, members))


CHECKS = {TRACEPARENT: valid_traceparent, TRACESTATE: valid_tracestate, BAGGAGE: valid_baggage}


def read(queue: str, message_id: str, fields: Mapping[bytes, bytes]) -> Trace | None:
    """The trace context of an entry's fields; None when it has none (nearly every job: three
    lookups). A field not usable is dropped, and logged (``_drop``)."""
    parent, state, baggage = (fields.get(TRACEPARENT), fields.get(TRACESTATE),
                              fields.get(BAGGAGE))  # fmt: skip
    if parent is None and state is None and baggage is None:
        return None
    kept: dict[bytes, str] = {}
    dropped: list[str] = []
    for name, raw in ((TRACEPARENT, parent), (TRACESTATE, state), (BAGGAGE, baggage)):
        if raw is None:
            continue
        value = _usable(name, raw) if name != TRACESTATE or TRACEPARENT in kept else None
        if value is not None:
            kept[name] = value
        else:
            dropped.append(name.decode())
            _drop(queue, message_id, name, raw, TRACEPARENT in kept)
    return Trace(kept.get(TRACEPARENT), kept.get(TRACESTATE), kept.get(BAGGAGE), tuple(dropped))


def _usable(name: bytes, raw: bytes) -> str | None:
    """The field ``name``'s value when it is usable, else None; never an exception, whatever a
    producer wrote (``Job.from_entry`` reads every entry with it: one that raised there would
    stall the jobs read with it, and never be dead-lettered)."""
    try:
        if CHECKS[name](raw) and _SAFE.fullmatch(raw):
            return raw.decode("ascii")
    except Exception:  # a check that missed a case: the field is dropped, the job runs
        log.debug("the check of %s failed", name.decode(), exc_info=True)
    return None


def _drop(queue: str, message_id: str, name: bytes, raw: bytes, parent: bool) -> None:
    """Say that a field was dropped: at INFO the first time for its queue and name, then at
    DEBUG (a producer that writes them wrong writes them wrong on every job)."""
    level = logging.DEBUG if (queue, name) in _SAID else logging.INFO
    if not log.isEnabledFor(level):
        return
    _SAID.add((queue, name))
    why = "without a usable traceparent" if name == TRACESTATE and not parent else "not W3C"
    log.log(level, "queue=%s message=%s: dropping %s %r (%d bytes): %s; the job runs without it",
            queue, message_id, name.decode(), raw[:64], len(raw), why)  # fmt: skip


def check(name: bytes, value: str | bytes) -> bytes:
    """``value`` for the field ``name`` as a producer sends it; ValueError when it is not
    usable (the daemon would drop it)."""
    raw = value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")
    if not CHECKS[name](raw):
        limit = {TRACESTATE: MAX_TRACESTATE, BAGGAGE: MAX_BAGGAGE}.get(name)
        most = f" of at most {limit} bytes" if limit else ""
        raise ValueError(f"{name.decode()} {raw[:80]!r}: not a W3C {name.decode()}{most}")
    return raw


def producer_fields(given: Mapping[bytes, str | None], fields: Mapping[bytes, bytes],
                    environ: Mapping[str, str]) -> dict[bytes, bytes]:  # fmt: skip
    """The trace context a producer sends with a job: what it ``given`` (field name -> value;
    None: not given, "": none), when anything is; else the job's own ``fields`` of those
    names, when any; else the producer's ``environ`` (TRACEPARENT, TRACESTATE, BAGGAGE: a
    handler's enqueue keeps its job's trace). What is given or in the fields is checked
    (ValueError); the environment's is taken when usable and left out otherwise, unsaid
    beyond a DEBUG line: a producer's environment never fails its enqueue."""
    chosen = {name: value for name, value in given.items() if value is not None}
    own = [name for name in FIELDS if name in fields]
    if chosen and own:
        raise ValueError("give the trace context as arguments or as fields, not both")
    if chosen:
        found = {name: check(name, value) for name, value in chosen.items() if value}
    elif own:
        found = {name: check(name, fields[name]) for name in own}
    else:
        return _environment(environ)
    if TRACESTATE in found and TRACEPARENT not in found:
        raise ValueError("tracestate without a traceparent: give both, or neither")
    return found


def _environment(environ: Mapping[str, str]) -> dict[bytes, bytes]:
    """The usable trace context of a producer's environment (a tracestate only with its
    traceparent)."""
    found: dict[bytes, bytes] = {}
    for name in FIELDS:
        value = environ.get(VARIABLES[name])
        if not value or (name == TRACESTATE and TRACEPARENT not in found):
            continue
        raw = value.encode("utf-8", "surrogateescape")
        if CHECKS[name](raw):
            found[name] = raw
        else:
            log.debug("the environment's %s %r is not W3C: not sent", VARIABLES[name], raw[:64])
    return found


def ndjson_value(key: str, value: object) -> str:
    """A trace key's value on a ``jobd enqueue --ndjson`` line (checked when it is sent)."""
    if not isinstance(value, str):
        raise ValueError(f'{key}: give a string (W3C trace context; "": none)')
    return value


def whole(line: Mapping[str, object]) -> dict[str, str]:
    """An --ndjson line's trace context replaces the flags' whole: those of its trace keys it
    does not give are none ("")."""
    if not any(key in line for key in KEYS):
        return {}
    return {key: "" for key in KEYS if key not in line}
