"""How queues may share Redis: never one stream with one group, never a dead-letter stream that
is another queue's stream or (mostly) another queue's dead-letter stream, and on a Redis Cluster
every key of a queue in its stream's slot.

A queue whose stream, group or dead-letter stream did not pass the schema is left out: what it
would collide with is not known.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.crc import key_slot

from jobd.config.problems import Problem
from jobd.config.queue_settings import QueueSettings
from jobd.config.view import ConfigView, Unchecked
from jobd.config.yamlsrc import Path, Pos
from jobd.store import keys


@dataclass(frozen=True)
class Streams:
    """What a queue reads and writes in Redis, for comparing queues."""

    name: str
    stream: str
    group: str
    dead_letter: str


def cross_queue_problems(
    queues: list[QueueSettings], view: ConfigView, cluster: bool = False
) -> list[Problem]:
    streams = [s for s in map(_streams, queues) if s is not None]
    problems = _shared_dead_letter_problems(streams, view)
    seen: dict[tuple[str, str], str] = {}
    owners = {s.stream: s.name for s in streams}
    for s in streams:
        where = view.doc.key_pos(("queues", s.name))
        other = seen.setdefault((s.stream, s.group), s.name)
        if other != s.name:
            message = (
                f"reads stream {s.stream!r} with group {s.group!r} like queue {other!r}; "
                "two queues would take each other's jobs: use another stream or group"
            )
            problems.append(Problem(where, ("queues", s.name), message))
        owner = owners.get(s.dead_letter)
        if owner is not None and owner != s.name:
            message = (
                f"the dead-letter stream {s.dead_letter!r} is the stream of queue {owner!r}; "
                "dead letters would run there: name another stream"
            )
            problems.append(Problem(where, ("queues", s.name, "dead_letter", "stream"), message))
        if cluster:
            problems += _cluster_slot_problems(s, view)
    return problems


def _streams(q: QueueSettings) -> Streams | None:
    try:
        return Streams(q.name, q.stream(), q.get("group"), q.keys().dead_letter)
    except Unchecked:
        return None


def _cluster_slot_problems(s: Streams, view: ConfigView) -> list[Problem]:
    if not keys.can_derive(s.stream):
        message = (
            f"the stream {s.stream!r} has a '}}' but no {{hash tag}}, so its other keys "
            f"cannot share its Redis Cluster slot: give it a hash tag, e.g. "
            f"'{{{s.stream.replace('}', '')}}}'"
        )
        return [view.problem(("queues", s.name, "stream"), message)]
    if key_slot(s.dead_letter.encode()) != key_slot(s.stream.encode()):
        message = (
            f"the dead-letter stream {s.dead_letter!r} is in another Redis Cluster slot than "
            f"the stream {s.stream!r}; one script writes both: name it "
            f"{keys.derive(s.stream, 'dead')!r} (the default) or give both one hash tag"
        )
        return [view.problem(("queues", s.name, "dead_letter", "stream"), message)]
    return []


def _shared_dead_letter_problems(streams: list[Streams], view: ConfigView) -> list[Problem]:
    """A dead-letter stream written by two queues on different streams: `jobd dlq` on one
    would list and purge the other's records, and requeue its jobs into its own stream, where
    its own command runs them. Queues reading one stream with two groups are left alone: each
    group gets every job of that stream anyway, and their default is the same derived name."""
    problems: list[Problem] = []
    first: dict[str, Streams] = {}
    for s in streams:
        other = first.setdefault(s.dead_letter, s)
        if other.stream != s.stream:
            problems.append(_shared_dead_letter(s, other, view))
    return problems


def _shared_dead_letter(s: Streams, other: Streams, view: ConfigView) -> Problem:
    path = ("queues", s.name, "dead_letter", "stream")
    where, set_in = _written_at(view, path)
    own = keys.derive(s.stream, "dead")
    hint = f"name another, e.g. {own!r} (the default)"
    if own == s.dead_letter:  # the other queue named this one's default by hand
        hint = f"name another for queue {other.name!r}"
    message = (
        f"the dead-letter stream {s.dead_letter!r} is queue {other.name!r}'s too{set_in}; "
        "`jobd dlq` would list and purge either queue's records, and requeue the other's jobs "
        f"into this queue's stream to run under its command: {hint}"
    )
    return Problem(where, path, message)


def _written_at(view: ConfigView, path: Path) -> tuple[Pos, str]:
    """Where the value at ``path`` (a queue's) is written: in the queue, in ``defaults``
    (then also a note saying so), or nowhere (a derived default: the queue's key)."""
    values = view.doc.values
    if path in values:
        return values[path], ""
    in_defaults = ("defaults", *path[2:])
    if in_defaults in values:
        return values[in_defaults], " (value set in defaults)"
    return view.doc.key_pos(path[:2]), ""
