"""How queues may share Redis: never one stream with one group, never a dead-letter stream that
is another queue's stream or (mostly) another queue's dead-letter stream, and on a Redis Cluster
every key of a queue in its stream's slot.

A queue whose stream, group or dead-letter stream did not pass the schema is left out: what it
would collide with is not known.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    derived: keys.Derived  # every other key jobd derives from the stream (keys.py)


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
    return problems + _derived_key_problems(streams, view)


def _streams(q: QueueSettings) -> Streams | None:
    try:
        names, default = q.priorities()
        levels = [n for n in names or () if n != (default or names[-1])]
        queue_keys = q.keys()
        return Streams(
            q.name, q.stream(), q.get("group"), queue_keys.dead_letter, queue_keys.derived(levels)
        )
    except Unchecked:
        return None


def _derived_key_problems(streams: list[Streams], view: ConfigView) -> list[Problem]:
    """A stream or dead-letter stream that is a key jobd derives from another queue's stream
    (or, for a dead-letter stream, from its own): a priority level's stream, a delayed set,
    a job mark…; two streams from which jobd derives the same keys (``x`` and ``{x}``); and
    a stream from which jobd derives keys that are another queue's (``_overlap``). Sharing one
    would run one queue's jobs under the other's command, run dead letters again for ever,
    or let ``jobd dlq purge`` delete a live stream. One problem a pair of queues at most
    besides the stream and dead-letter checks: the first collision says what to change."""
    problems: list[Problem] = []
    told: set[frozenset[str]] = set()  # pairs of queues already told apart
    for i, s in enumerate(streams):
        for other in streams[:i]:
            same = keys.derive(s.stream, "delayed")
            if other.stream != s.stream and same == keys.derive(other.stream, "delayed"):
                message = (
                    f"from the stream {s.stream!r} jobd derives the same keys (e.g. {same!r}) "
                    f"as from queue {other.name!r}'s stream {other.stream!r}; the two queues "
                    "would share their delayed jobs, marks and history: name another stream"
                )
                problems.append(_at(view, ("queues", s.name, "stream"), message))
                told.add(frozenset((s.name, other.name)))
        own_dead = s.dead_letter == keys.derive(s.stream, "dead")
        for other in streams:
            what = other.derived.holds(s.stream) if other.stream != s.stream else None
            if what is not None:
                message = (
                    f"the stream {s.stream!r} is {what} of queue {other.name!r}; jobd would "
                    "use that key for both queues: name another stream"
                )
                problems.append(_at(view, ("queues", s.name, "stream"), message))
                told.add(frozenset((s.name, other.name)))
            if own_dead:  # a default one is a key derived from the stream (``_overlap``)
                continue
            if (what := other.derived.holds(s.dead_letter)) is not None:
                whose = "this queue" if other is s else f"queue {other.name!r}"
                message = (
                    f"the dead-letter stream {s.dead_letter!r} is {what} of {whose}; dead "
                    "letters written there would be run again or mixed with live keys, and "
                    "`jobd dlq purge` would delete them: name another, e.g. "
                    f"{keys.derive(s.stream, 'dead')!r} (the default)"
                )
                problems.append(_at(view, ("queues", s.name, "dead_letter", "stream"), message))
                told.add(frozenset((s.name, other.name)))
    return problems + _overlap_problems(streams, told, view)


def _overlap_problems(
    streams: list[Streams], told: set[frozenset[str]], view: ConfigView
) -> list[Problem]:
    """``_overlap`` for each pair of queues on two streams not ``told`` apart already."""
    problems: list[Problem] = []
    for i, s in enumerate(streams):
        for other in streams[:i]:
            if other.stream == s.stream or frozenset((s.name, other.name)) in told:
                continue
            found = _overlap(s, other) or _overlap(other, s)
            if found is not None:
                whose, message = found
                problems.append(_at(view, ("queues", whose.name, "stream"), message))
    return problems


def _overlap(s: Streams, other: Streams) -> tuple[Streams, str] | None:
    """A key jobd derives from ``s``'s stream (its default dead-letter stream included) that
    is one of ``other``'s, or a family of ``s``'s keys inside one of ``other``'s: queue ``a``'s
    job marks are ``{a}:job:ID``, so a queue on ``{a}:job`` has its dead letters, history and
    events on ``{a}:job:dead``… — a's marks of job ids 'dead', 'history'…, which a job of
    ``a`` with such an id overwrites. (None: they share no key.)"""
    mine = dict(s.derived.exact)
    if s.dead_letter == keys.derive(s.stream, "dead"):
        mine[s.dead_letter] = "the dead-letter stream"
    shared = [(key, own, other.derived.holds(key)) for key, own in mine.items()]
    shared += [
        (f"{prefix}…", own, what)
        for prefix, own in s.derived.families.items()
        for p, what in other.derived.families.items()
        if prefix != p and prefix.startswith(p)
    ]
    found = next(((key, own, what) for key, own, what in shared if what is not None), None)
    if found is None:
        return None
    key, own, what = found
    message = (
        f"from the stream {s.stream!r} jobd derives {key!r} ({own}), which is {what} of "
        f"queue {other.name!r}; jobd would use that key for both queues (a job id of one "
        "could overwrite the other's dead letters): name another stream"
    )
    return s, message


def _at(view: ConfigView, path: Path, message: str) -> Problem:
    where, set_in = _written_at(view, path)
    return Problem(where, path, message.replace(";", f"{set_in};", 1) if set_in else message)


def _cluster_slot_problems(s: Streams, view: ConfigView) -> list[Problem]:
    if not keys.can_derive(s.stream):
        message = (
            f"the stream {s.stream!r} has a '}}' but no {{hash tag}}, so its other keys "
            f"cannot share its Redis Cluster slot: give it a hash tag, e.g. "
            f"'{{{s.stream.replace('}', '')}}}'"
        )
        return [view.problem(("queues", s.name, "stream"), message)]
    # The default name (derive) is in the stream's slot by construction: redis, for its slot
    # function, is imported only for another name (`jobd validate` talks to no Redis).
    if s.dead_letter != keys.derive(s.stream, "dead") and _slot(s.dead_letter) != _slot(s.stream):
        message = (
            f"the dead-letter stream {s.dead_letter!r} is in another Redis Cluster slot than "
            f"the stream {s.stream!r}; one script writes both: name it "
            f"{keys.derive(s.stream, 'dead')!r} (the default) or give both one hash tag"
        )
        return [view.problem(("queues", s.name, "dead_letter", "stream"), message)]
    return []


def _slot(key: str) -> int:
    from redis.crc import key_slot

    return key_slot(key.encode())


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
