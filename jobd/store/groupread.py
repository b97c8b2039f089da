"""A queue's consumer group as ``lua/lib/group.lua`` reads it for ``status`` (the summary,
`jobd status`, a daemon's report, the waiting tab): which groups the config reads each stream
with, the spec that names them to the script, and its reply as a ``Group``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from jobd.config import QueueConfig

# A queue's group (``read_hashes``, ``lua/lib/group.lua``): each reply weighed before it is
# asked, by the stream's MEMORY USAGE (SAMPLES 1: its first and last nodes of entries, and its
# consumers' names; nothing copied). Read only when the stream weighs no more than the
# request's ``LagBudget`` may still copy (XINFO STREAM copies its first and last entries,
# XPENDING one name) and every group on it is one of the config's (XINFO GROUPS copies every
# group's name, which nothing weighs); its consumers are listed when it has HASH_FIELDS or
# fewer and the weight is CONSUMER_NAMES_READ or less (else only counted), each name cut to
# HASH_VALUE bytes.
CONSUMERS_LISTED = 256  # status.HASH_FIELDS
CONSUMER_NAMES_READ = 1 << 20  # lua/lib/group.lua NAMES_READ


def stream_groups(queues: Iterable[QueueConfig]) -> dict[str, list[str]]:
    """The groups ``queues`` (every level of each) read each stream with: a stream's group is
    read only when these are all the groups it has (``lua/lib/group.lua``)."""
    found: dict[str, list[str]] = {}
    for q in queues:
        for level in q.all_levels():
            names = found.setdefault(level.stream, [])
            if level.group not in names:
                names.append(level.group)
    return found


def group_spec(kind: str, group: str, others: Iterable[str] = ()) -> str:
    """A stream's spec for ``hashes_shown``: ``kind`` ('>' with its consumers, '=' alone), then
    ``group`` and the config's other groups on the stream, each as LENGTH:NAME (in bytes)."""
    names = [group, *(g for g in others if g != group)]
    return kind + "".join(f"{len(n.encode())}:{n}" for n in names)


@dataclass(frozen=True)
class Group:
    """A queue's consumer group as ``lua/lib/group.lua`` reads it: its last delivered id, lag
    (None: Redis says null), pending entries and the oldest one's id, how many consumers it has
    (``count``), and whether they are ``listed`` in ``consumers`` (CONSUMERS_LISTED at most:
    (name cut to HASH_VALUE bytes, the name's length, entries held, idle ms) each); ``groups``:
    how many the stream has (None: not counted); ``copied``: bytes the read copied in Redis.
    With groups the config does not name on the stream (their names may be of any size), or a
    stream weighing more than the budget left, the group is not read: ``last_delivered``,
    ``lag``, ``pending`` and ``count`` are None (and ``oldest`` too for a stream too heavy)."""

    last_delivered: bytes | None
    lag: int | None
    pending: int | None
    oldest: bytes | None
    count: int | None
    listed: bool
    consumers: list[tuple[bytes, int, int, int]]
    groups: int | None = 1
    copied: int = 0


def group_reply(reply: list[Any]) -> Group | None:
    if not (reply[0] and reply[1]):
        return None  # no such group, no stream, or a key of another type
    flat = reply[10:]
    consumers = [tuple(flat[i : i + 4]) for i in range(0, len(flat), 4)]
    last, lag, pending, oldest, count = reply[2:7]  # nil (None): not read
    return Group(last, lag, _int(pending), oldest, _int(count), bool(reply[7]),
                 consumers, _int(reply[8]), int(reply[9]))  # type: ignore[arg-type]  # fmt: skip


def _int(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]
