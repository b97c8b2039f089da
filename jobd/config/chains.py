"""A queue's declarative chains (docs: Workflows): ``then:`` (follow-ups of each done job) and
``on_dead_letter:`` (the record of each dead-lettered job, enqueued elsewhere); their checks
and their typed steps.

Checked here: each step names a queue of the config, and the steps make no cycle, unless a
step of the cycle says ``cycle: allowed``: a chain that leads back to where it started
enqueues for ever (every job done enqueues the next), or, through ``on_dead_letter``, turns
one failing hook into an endless stream of dead letters. Each problem is placed at the step
that closes the cycle, with the chain it makes. An ``on_dead_letter`` queue takes payloads of
``MIN_HOOK_PAYLOAD`` at least: the record's JSON is cut to fit its ``max_payload``
(store/chains.py), and below that even a record whose values are cut to nothing may not fit.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, replace

from jobd.config import durations, sizes
from jobd.config.problems import Problem
from jobd.config.queue_settings import QueueSettings
from jobd.config.types import ChainStep, QueueConfig
from jobd.config.view import Unchecked
from jobd.config.yamlsrc import Path

ALLOWED = "allowed"  # a step's `cycle:` that lets a chain lead back to where it started
DEFAULT_PAYLOAD = "result"  # a `then:` step's payload when it names none
MIN_HOOK_PAYLOAD = 1024  # an on_dead_letter queue's max_payload at least (bytes)


@dataclass(frozen=True)
class Edge:
    """One step of a chain: from a queue to another, where it is written, whether it may close
    a cycle."""

    source: QueueSettings
    target: str
    sub: Path  # in the source queue: ("then", i) or ("on_dead_letter",)
    allowed: bool


def steps_of(q: QueueSettings) -> list[tuple[Path, Mapping[str, object]]]:
    """The queue's chain steps as written: (where, the step's mapping). Unchecked when the
    schema refused them."""
    return _then_steps(q) + _hook_steps(q)


def _then_steps(q: QueueSettings) -> list[tuple[Path, Mapping[str, object]]]:
    """The queue's `then:` steps as written. Unchecked when the schema refused them."""
    return [(("then", i), step) for i, step in enumerate(q.get("then", default=[]))]


def _hook_steps(q: QueueSettings) -> list[tuple[Path, Mapping[str, object]]]:
    """The queue's `on_dead_letter` as a step (none when it names no queue). Unchecked when
    the schema refused it."""
    hook = q.get("on_dead_letter", default={})
    return [] if hook.get("queue") is None else [(("on_dead_letter",), hook)]


def chain_problems(queues: Mapping[str, QueueSettings], names: list[str]) -> list[Problem]:
    """A step naming a queue not among ``names`` (every queue of the file), and each cycle of
    steps not marked ``cycle: allowed``. A refused `then:` leaves its steps out, not the
    queue's `on_dead_letter` (nor the other way round): each is read on its own."""
    problems: list[Problem] = []
    edges: list[Edge] = []
    for q in queues.values():
        for read in (_then_steps, _hook_steps):
            try:
                written = read(q)
            except Unchecked:
                continue
            for sub, step in written:
                target = str(step["queue"])
                if target not in names:
                    problems.append(q.problem((*sub, "queue"), _unknown(target, names)))
                elif target in queues:
                    edges.append(Edge(q, target, sub, step.get("cycle") == ALLOWED))
                    problems += _hook_payload_problems(q, sub, queues[target])
    return problems + _cycle_problems([e for e in edges if not e.allowed])


def _hook_payload_problems(q: QueueSettings, sub: Path, target: QueueSettings) -> list[Problem]:
    """An ``on_dead_letter`` queue whose max_payload is below ``MIN_HOOK_PAYLOAD``."""
    if sub[0] != "on_dead_letter":
        return []
    try:
        most = sizes.parse(target.get("max_payload"))
    except (Unchecked, ValueError):  # its own problem is told at its max_payload
        return []
    if most >= MIN_HOOK_PAYLOAD:
        return []
    return [q.problem((*sub, "queue"), (
        f"queue {target.name!r} takes payloads of {most} bytes at most (its max_payload): a "
        f"dead-letter record's JSON, its values cut to fit, needs {MIN_HOOK_PAYLOAD} bytes at "
        f"least; give queue {target.name!r} a max_payload of 1KiB or more"))]  # fmt: skip


def _unknown(target: str, names: list[str]) -> str:
    close = difflib.get_close_matches(target, names, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"name one of: {', '.join(names)}"
    return f"queue {target!r} is not in the config: {hint}"


def _cycle_problems(edges: list[Edge]) -> list[Problem]:
    """One problem per cycle of ``edges`` (those not allowed to close one), at the first of
    its steps in file order."""
    out: dict[str, list[Edge]] = {}
    for e in edges:
        out.setdefault(e.source.name, []).append(e)
    problems: list[Problem] = []
    told: set[frozenset[str]] = set()
    for e in edges:
        path = _path_back(e, out)
        if path is None or frozenset(x.source.name for x in path) in told:
            continue
        told.add(frozenset(x.source.name for x in path))
        chain = " → ".join([*(x.source.name for x in path), e.source.name])
        problems.append(e.source.problem((*e.sub, "queue"), _cycle(chain, e)))
    return problems


def _cycle(chain: str, e: Edge) -> str:
    """What is wrong with the cycle ``chain`` that ``e`` closes, and how to fix it."""
    if e.sub[0] == "on_dead_letter":
        return (
            f"the chain {chain} leads back to queue {e.source.name!r}: a dead letter's hook "
            "that fails would be dead-lettered into itself again, for ever; send the dead "
            "letters of this queue to another queue, or write `cycle: allowed` in "
            "on_dead_letter if that is meant"
        )
    return (
        f"the chain {chain} leads back to queue {e.source.name!r}: each job would enqueue "
        "the next for ever; end the chain elsewhere, or write `cycle: allowed` on one of its "
        "steps if that is meant (e.g. a job that runs again every minute: "
        f"{{queue: {e.target}, payload: payload, delay: 1m, cycle: allowed}})"
    )


def _path_back(first: Edge, out: Mapping[str, list[Edge]]) -> list[Edge] | None:
    """The steps from ``first``'s source through ``first`` back to that source, if there is
    such a path (breadth first: the shortest)."""
    start = first.source.name
    came: dict[str, list[Edge]] = {first.target: [first]}
    frontier = [first.target]
    while frontier:
        following: list[str] = []
        for name in frontier:
            if name == start:
                return came[name]
            for e in out.get(name, []):
                if e.target not in came:
                    came[e.target] = [*came[name], e]
                    following.append(e.target)
        frontier = following
    return None


def attach(
    queue: QueueConfig, q: QueueSettings, queues: Mapping[str, QueueSettings]
) -> QueueConfig:
    """``queue`` (and each of its priority levels) with its chain steps, from a checked file."""
    then: list[ChainStep] = []
    hook: ChainStep | None = None
    for sub, step in steps_of(q):
        target = queues[str(step["queue"])]
        if sub[0] == "then":
            delay = step.get("delay")
            then.append(ChainStep(target.name, target.keys(),
                                  str(step.get("payload", DEFAULT_PAYLOAD)),
                                  None if delay is None else durations.parse(delay)))  # fmt: skip
        else:
            hook = ChainStep(target.name, target.keys(), "record",
                             max_payload=sizes.parse(target.get("max_payload")))  # fmt: skip
    if not then and hook is None:
        return queue
    chained = {"then": tuple(then), "on_dead_letter": hook}
    levels = tuple(replace(level, **chained) for level in queue.levels)  # type: ignore[arg-type]
    return replace(queue, levels=levels, **chained)  # type: ignore[arg-type]
