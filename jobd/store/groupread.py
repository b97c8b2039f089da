"""A queue's consumer group as ``lua/lib/group.lua`` reads it for ``status`` (the summary,
`jobd status`, a daemon's report, the waiting tab): the spec that names it to the script, and
its reply as a ``Group``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# A queue's group (``read_hashes``, ``lua/lib/group.lua``): read without copying any entry of the
# stream (producers' data); the groups' and consumers' names it copies are consumer-role data
# (docs/security.md), not weighed. Its consumers are listed when it has CONSUMERS_LISTED or
# fewer (else only counted), each name cut to HASH_VALUE bytes.
CONSUMERS_LISTED = 256  # status.HASH_FIELDS


def group_spec(kind: str, group: str) -> str:
    """A stream's spec for ``hashes_shown``: ``kind`` ('>' with its consumers, '=' alone), then
    ``group``."""
    return kind + group


@dataclass(frozen=True)
class Group:
    """A queue's consumer group as ``lua/lib/group.lua`` reads it: its last delivered id, lag
    (None: Redis says null), pending entries and the oldest one's id, how many consumers it has
    (``count``), and whether they are ``listed`` in ``consumers`` (CONSUMERS_LISTED at most:
    (name cut to HASH_VALUE bytes, the name's length, entries held, idle ms) each); ``groups``:
    how many the stream has; ``oldest_idle``: the oldest pending entry's idle ms (Redis's clock
    since its last delivery: its id's time is the producer's to choose); ``length``: the
    stream's (XLEN, read with it; a lag past it, entries trimmed before they were delivered, is
    None: not known); ``at_most``: where the lag is not known, at most how many entries wait
    (the length, or less from the groups' entries-read: never counted by reading entries)."""

    last_delivered: bytes
    lag: int | None
    pending: int
    oldest: bytes | None
    count: int
    listed: bool
    consumers: list[tuple[bytes, int, int, int]]
    groups: int = 1
    oldest_idle: int = 0
    length: int = 0
    at_most: int | None = None


def group_reply(reply: list[Any]) -> Group | None:
    if not (reply[0] and reply[1]):
        return None  # no such group, no stream, or a key of another type
    flat = reply[12:]
    consumers = [tuple(flat[i : i + 4]) for i in range(0, len(flat), 4)]
    last, lag, pending, oldest, count = reply[2:7]  # lag, oldest: nil (None) when none
    return Group(last, lag, int(pending), oldest, int(count), bool(reply[7]),
                 consumers, int(reply[8]), int(reply[9]), int(reply[10]),
                 reply[11])  # type: ignore[arg-type]  # fmt: skip
