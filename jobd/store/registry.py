"""The daemon registry: which daemons run, where, serving what, and when each last beat.

Each daemon writes its record every few seconds (``beat``, ``lua/beat.lua``: one script call, on
its ticker, never per job) and removes it on a clean stop (``deregister``); ``listing`` reads
them all for ``jobd status`` and the dashboard. Keys (``keys.DAEMONS``, ``DAEMONS_SWEEP``,
``daemon_record``): a sorted set of daemons by their last beat, one by when their entry goes, and
one hash per daemon. Every time is Redis's clock (the script's TIME): hosts' clocks never meet.

A daemon is *alive* while it beats; *stale* once it missed a few beats (``STALE_BEATS``: stopped,
frozen, cut off from Redis); *dead* once its last beat is older than its lease (the smallest
``lease.reclaim_after`` of its queues: its jobs can be taken over from then on); *stopping* between
its SIGTERM and its end. A dead daemon's entry goes ``KEEP_FACTOR`` × its largest
``reclaim_after`` after its last beat (the bound at which the janitors remove its empty consumers:
``daemon.janitor``), swept by any daemon's beat; its record expires by itself then.

What the registry holds was written by anyone who can write to Redis: a key of another type, a
record with garbage fields, a field of any size. Reading never fails on it, and reads only the
fields jobd writes, each up to a bound (``READ``), every number bounded (``MAX_NUMBER``): each
daemon says what is wrong with its record (``problems``), and the listing what is wrong with
the registry (``error``); the beat
refuses to write over another's key (``RegistryError``) and the daemon goes on without it.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import orjson
import redis

from jobd.store import connection as redisconn
from jobd.store import scripts
from jobd.store.base import StoreBase
from jobd.store.keys import DAEMON_RECORD, DAEMONS, DAEMONS_SWEEP, daemon_record

STALE_BEATS = 3  # beats missed (less one) before a daemon is shown stale
KEEP_FACTOR = 10  # × the largest reclaim_after: how long a dead daemon stays listed
SWEPT_PER_BEAT = 16  # other daemons' entries one beat sweeps at most
LISTED = 1000  # daemons listed at most: the newest beats (older ones are counted, not listed)
AHEAD_MS = 60_000  # a beat this far ahead of Redis's clock is listed (the clock stepped back)
TEXT_SHOWN = 256  # characters shown of a field someone else wrote
MAX_NUMBER = 2**53 - 1  # a record's numbers are at most this (JSON's exact integers); ms too
NUMBER_READ = 20  # bytes of a numeric field read at most (a longer one is not a count here)
QUEUES_READ = 256 * 1024  # bytes of a record's queues read at most (JSON of every queue served)
# Bytes of fields a listing reads in all (the newest beats first): a field that would pass them
# is not read, and said so. A daemon serving 50 queues writes about 5 KiB of queues, read once
# for all the daemons serving the same (``queues_sha``): a fleet of 1 000 daemons alike costs
# about 100 KiB of small fields, and 768 KiB holds about 150 records of 50 queues served by no
# other.
LISTING_READ = 768 * 1024
# Bytes of the longest consumer name jobd writes (``lease.consumer_name``: a host name of at
# most 255, a pid, 16 hex digits, a process index): a longer name's record is never read, and a
# listing reads LISTED names this long at most (312 KiB; one name more at most: the one that
# passes them, of any length, after which no more are listed).
NAME_READ = 320
# The fields of a record read (no other: a field someone else added is never read), and the
# most bytes of each (a longer one is not read at all, and said so).
READ = (
    ("host", TEXT_SHOWN), ("version", TEXT_SHOWN), ("state", TEXT_SHOWN),
    ("queues", QUEUES_READ), *((name, NUMBER_READ) for name in (
        "pid", "process", "running", "slots", "beat_every", "lease", "started", "clash")),
)  # fmt: skip


class RegistryError(Exception):
    """A registry key holds something else than jobd writes there."""


@dataclass(frozen=True, slots=True)
class Served:
    """A queue a daemon serves: one stream and group (a priority level is one of its own)."""

    name: str
    stream: str
    group: str
    concurrency: int

    def json(self) -> dict[str, Any]:
        return {"name": self.name, "stream": self.stream, "group": self.group,
                "concurrency": self.concurrency}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Beat:
    """What a daemon writes of itself at each beat; ``queues`` None: unchanged, not sent."""

    host: str
    pid: int
    version: str
    process: int | None
    queues: tuple[Served, ...] | None
    running: int
    slots: int
    beat_every_ms: int
    lease_ms: int
    keep_ms: int
    state: str  # "running" or "stopping"
    instance: str = ""  # this process's own token (a clash of names is found by it: beat.lua)

    def fields(self) -> list[object]:
        pairs: list[object] = [
            "host", self.host, "pid", self.pid, "version", self.version,
            "process", "" if self.process is None else self.process,
            "running", self.running, "slots", self.slots, "beat_every", self.beat_every_ms,
            "lease", self.lease_ms, "state", self.state,
        ]  # fmt: skip
        if self.queues is not None:
            queues = orjson.dumps([q.json() for q in self.queues])
            # Its digest: a listing reads the queues of daemons serving the same once.
            pairs += ["queues", queues, "queues_sha", hashlib.sha1(queues).hexdigest()]
        return pairs


@dataclass(frozen=True, slots=True)
class Beaten:
    now_ms: int  # Redis's clock
    created: bool  # the record was new (or had expired: a daemon frozen that long)
    swept: int  # other daemons' entries swept


class RegistryOps(StoreBase):
    def beat(self, consumer: str, beat: Beat) -> Beaten:
        """Write this daemon's record and last beat; sweep entries gone stale long ago. Raises
        RegistryError, writing nothing, when a registry key holds another type."""
        keys = [DAEMONS, DAEMONS_SWEEP, daemon_record(consumer)]
        args = [consumer, beat.keep_ms, SWEPT_PER_BEAT, beat.instance, *beat.fields()]
        reply = self.scripts.beat(keys=keys, args=args)
        if bytes(reply[0]) == b"wrongtype":
            key, kind = _text(reply[1]), _text(reply[2])
            raise RegistryError(
                f"the daemon registry's key {key} holds a {kind}, written by someone else: "
                "this daemon is not listed until it is deleted"
            )
        return Beaten(int(reply[1]), bool(reply[2]), int(reply[3]))

    def deregister(self, consumer: str) -> None:
        """Remove this daemon from the registry (a clean stop). A key of another type is left
        as it is (its command fails alone: one pipeline, no transaction)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zrem(DAEMONS, consumer)
        pipe.zrem(DAEMONS_SWEEP, consumer)
        pipe.delete(daemon_record(consumer))
        pipe.execute(raise_on_error=False)


def listing(client: redis.Redis) -> dict[str, Any]:
    """Every daemon listed (the ``LISTED`` newest beats, oldest first) as ``jobd status
    --json`` shows it, Redis's time, and what is wrong with the registry if anything
    (``error``): more entries than listed, entries beating ahead of the clock (not listed). One
    script call on the registry's node (``lua/daemons_listed.lua``): its clock, and of each
    record only the fields jobd writes, each read only up to its bound (``READ``), and
    LISTING_READ bytes of them in all; names read one at a time, LISTED × NAME_READ bytes of
    them at most (and the one name that passes them: then no more listed, and said so)."""
    args: list[object] = [LISTED, DAEMON_RECORD, TEXT_SHOWN, AHEAD_MS, LISTING_READ, NAME_READ,
                          "queues", "queues_sha"]  # fmt: skip
    for name, cap in READ:
        args += [name, cap]
    reply = scripts.call(client, "daemons_listed", [DAEMONS], args)
    if bytes(reply[0]) == b"wrongtype":
        return {"time": _redis_seconds(client), "daemons": [], "error": (
            f"the daemon registry's key {DAEMONS} holds a {_text(reply[1])}, not a sorted set: "
            "daemons cannot be listed until it is deleted")}  # fmt: skip
    now_ms, total, rows, ahead = int(reply[1]), int(reply[2]), reply[3], int(reply[4])
    spent = int(reply[5])
    result: dict[str, Any] = {"time": now_ms / 1000, "daemons": [], "error": None}
    entries = [Listed.of(row) for row in rows]
    alike = {e.digest: e.fields[b"queues"] for e in entries if e.digest and b"queues" in e.fields
             and hashlib.sha1(e.fields[b"queues"]).hexdigest().encode() == e.digest}  # fmt: skip
    for entry in entries:
        if entry.digest in alike and b"queues" not in entry.fields:
            entry.fields[b"queues"] = alike[entry.digest]  # read once, in a newer row
        found = daemon_json(entry, now_ms)
        if found is not None:
            result["daemons"].append(found)
    said = []
    if total - ahead > len(rows):
        why = f" (its {LISTED * NAME_READ >> 10} KiB of names spent)" if spent else ""
        said.append(f"{total - ahead} daemons in the registry: the {len(rows)} newest beats "
                    f"listed{why}")  # fmt: skip
    shared = sum(1 for d in result["daemons"] if d["clash"])
    if shared:
        said.append(f"{shared} daemon names are each used by more than one process (their "
                    "names clash): each listed once")  # fmt: skip
    if ahead:
        said.append(f"{ahead} entries beat ahead of Redis's clock (+inf, or a time to come: "
                    "written by no daemon): not listed")  # fmt: skip
    result["error"] = "; ".join(said) or None
    return result


def _redis_seconds(client: redis.Redis) -> float:
    seconds, micros = redisconn.node_for(client, DAEMONS).time()
    return int(seconds) + int(micros) / 1e6


@dataclass(frozen=True, slots=True)
class Listed:
    """A registry entry as ``daemons_listed.lua`` returns it: its name (cut to TEXT_SHOWN) and
    whole length, its score as Redis wrote it, its record's type, and the fields read (those
    too long to be read are in ``unread`` with their length; those left out once the listing's
    bytes were spent, in ``spent``)."""

    name: bytes
    name_length: int
    score: bytes
    record_type: str
    fields: dict[bytes, bytes]
    unread: dict[str, int]
    spent: dict[str, int]
    digest: bytes | None  # its queues' SHA-1 (``Beat.fields``): read once for those alike

    @classmethod
    def of(cls, row: list[Any]) -> Listed:
        fields, unread, spent = {}, {}, {}
        for (name, _), value, size in zip(READ, row[5::2], row[6::2], strict=True):
            if value is not None:
                fields[name.encode()] = bytes(value)
            elif int(size) < 0:
                spent[name] = -int(size)
            elif size:
                unread[name] = int(size)
        digest = bytes(row[4]) if row[4] is not None else None
        return cls(bytes(row[0]), int(row[1]), bytes(row[2]), _text(row[3]), fields, unread,
                   spent, digest)  # fmt: skip


def daemon_json(entry: Listed, now_ms: int) -> dict[str, Any] | None:
    """A daemon as listed; None for an entry whose record is gone and whose beat is past any
    lease (swept, or about to be). Every number is bounded (``MAX_NUMBER``): one that is not
    is left out and said so (``problems``)."""
    problems: list[str] = []
    name = _text(entry.name)
    if entry.name_length > len(entry.name):
        problems.append(f"its name is {entry.name_length} bytes long: the first {TEXT_SHOWN} shown")
    if entry.record_type == "long":
        problems.append(f"its name is longer than any jobd writes ({NAME_READ} bytes): "
                        "its record not read")  # fmt: skip
    elif entry.record_type not in ("hash", "none"):
        problems.append(f"its record {_text(daemon_record(entry.name))} is not a hash "
                        f"(a {entry.record_type})")  # fmt: skip
    elif entry.record_type == "none":
        problems.append("its record is gone (expired, or deleted by someone)")
    for field, size in entry.unread.items():
        problems.append(f"{field} is {size} bytes long, more than jobd writes: not read")
    for field, size in entry.spent.items():
        problems.append(f"{field} ({size} bytes) not read: the listing read its "
                        f"{LISTING_READ >> 10} KiB of records")  # fmt: skip
    fields, unread = entry.fields, {*entry.unread, *entry.spent}
    number = _Numbers(fields, problems, unread, entry.record_type == "hash")
    beat_every, lease = number.get("beat_every", 5000), number.get("lease", 60000)
    beat_ms = _beat_ms(entry.score, problems)
    age_ms = None if beat_ms is None else max(0, now_ms - beat_ms)
    if entry.record_type == "none" and (age_ms is None or age_ms >= lease):
        return None
    said = _text(fields.get(b"state", b"running"))
    clash = number.get("clash", None, optional=True)
    clashing = clash is not None and age_ms is not None and beat_ms - clash < lease
    if clashing:
        problems.append("more than one process beats under this name (their names clash: they "
                        "share its record, consumer and leases): restart all but one")  # fmt: skip
    return {
        "name": name, "host": _field(fields, b"host"), "pid": number.get("pid"),
        "process": number.get("process", None, optional=True),
        "version": _field(fields, b"version"),
        "queues": [] if "queues" in unread else _queues(fields, problems),
        "queues_read": b"queues" in fields,
        "running": number.get("running"), "slots": number.get("slots"),
        "started": _seconds(number.get("started")), "beat": _seconds(beat_ms),
        "since_beat": _seconds(age_ms), "beat_every": beat_every / 1000, "lease": lease / 1000,
        "state": "dead" if age_ms is None else state_of(age_ms, beat_every, lease, said),
        "clash": clashing, "problems": problems,
    }  # fmt: skip


def _beat_ms(score: bytes, problems: list[str]) -> int | None:
    """An entry's last beat (its score), Redis ms; None, said so, for one that is not a time
    (another's ZADD: inf, negative, past any date)."""
    try:
        value = float(score)
    except ValueError:
        value = math.nan
    if not 0 <= value <= MAX_NUMBER:  # NaN too
        problems.append(f"its last beat is not a time: {_text(score[:TEXT_SHOWN])}")
        return None
    return int(value)


def state_of(age_ms: int, beat_every_ms: int, lease_ms: int, said: str) -> str:
    """alive, stale (beats missed), dead (its lease lapsed), or stopping (said so, not dead)."""
    if age_ms >= lease_ms:
        return "dead"
    if said == "stopping":
        return "stopping"
    return "stale" if age_ms > STALE_BEATS * beat_every_ms else "alive"


class _Numbers:
    """A record's numeric fields; one that is missing, not a number, or beyond MAX_NUMBER is
    None (or its default), and said so; one too long to be read was said so already."""

    def __init__(
        self, fields: dict[bytes, bytes], problems: list[str], unread: set[str], exists: bool
    ) -> None:
        self.fields, self.problems, self.unread, self.exists = fields, problems, unread, exists

    def get(self, name: str, default: int | None = None, optional: bool = False) -> Any:
        raw = self.fields.get(name.encode())
        if raw is None or (optional and raw == b""):
            if self.exists and not optional and name not in self.unread:
                self.problems.append(f"no {name}")
            return default
        if raw.isascii() and raw.isdigit() and int(raw) <= MAX_NUMBER:
            return int(raw)
        self.problems.append(f"{name} is not a count: {_text(raw[:TEXT_SHOWN])!r}")
        return default


def _queues(fields: dict[bytes, bytes], problems: list[str]) -> list[dict[str, Any]]:
    """The queues a record says its daemon serves; [] and a problem when they do not parse."""
    raw = fields.get(b"queues")
    if raw is None:
        if fields:
            problems.append("no queues (yet: they come with its next beat)")
        return []
    try:
        found = orjson.loads(raw)
        return [_queue(q) for q in found]
    except (orjson.JSONDecodeError, TypeError, KeyError, ValueError):
        problems.append(f"queues is not a list of queues: {_text(raw[:TEXT_SHOWN])!r}")
        return []


def _queue(q: Any) -> dict[str, Any]:
    served = Served(q["name"], q["stream"], q["group"], q["concurrency"])
    if not all(isinstance(v, str) for v in (served.name, served.stream, served.group)):
        raise TypeError(q)
    concurrency = served.concurrency
    if not isinstance(concurrency, int) or isinstance(concurrency, bool):
        raise TypeError(q)
    if not 0 <= concurrency <= MAX_NUMBER:
        raise ValueError(q)
    return served.json()


def serving(daemons: list[dict[str, Any]], stream: str, group: str) -> list[dict[str, Any]]:
    """The daemons listed that serve ``stream`` with ``group``, read from it yet or not."""
    return [
        {"name": d["name"], "state": d["state"]}
        for d in daemons
        if any(q["stream"] == stream and q["group"] == group for q in d["queues"])
    ]


def _field(fields: dict[bytes, bytes], name: bytes) -> str | None:
    raw = fields.get(name)
    return None if raw is None else _text(raw[:TEXT_SHOWN])


def _seconds(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


def _text(raw: bytes | str) -> str:
    return raw if isinstance(raw, str) else raw.decode("utf-8", "backslashreplace")
