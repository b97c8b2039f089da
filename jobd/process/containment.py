"""Which containment applies on this host, in words: what `jobd validate` and the daemon's
startup log say (see docs/concepts/containment.md)."""

from __future__ import annotations

from collections.abc import Iterable

from jobd.config import QueueConfig
from jobd.process import memory, where

# resources.X -> the cgroup controller that enforces it (memory has a fallback: sampling)
NEEDS = {"pids": "pids", "cpu": "cpu"}
# What this daemon process found at its start (``daemon.handlers``): a reload is judged by it.
ACTIVE: where.Found | str = "not looked for"


def describe(
    queues: Iterable[QueueConfig], subreaper: bool = True, found: where.Found | str = "unknown"
) -> list[str]:
    """The summary first; then a line for the queues whose memory is capped by sampling."""
    if isinstance(found, where.Found):
        escaped = "every process it starts ends with it (cgroup.kill)"
    elif subreaper:
        escaped = "processes that leave its group end with their job (jobd is a child subreaper)"
    else:
        escaped = "processes that leave its group may outlive their job (no child subreaper)"
    lines = [
        f"containment: each handler in a session of its own and {where.describe(found)}; " + escaped
    ]
    kernel = isinstance(found, where.Found) and "memory" in found.controllers
    sampled = [q.name for q in queues if q.resources.memory is not None and not kernel]
    if sampled:
        lines.append(
            f"resources.memory of {', '.join(sampled)}: each handler's tree's resident memory, "
            f"sampled every {memory.SAMPLE_EVERY:g}s (no cgroup memory controller here)"
        )
    return lines


def unenforced(queues: Iterable[QueueConfig], found: where.Found | str) -> list[str]:
    """A line for each queue resource this host cannot enforce (the daemon refuses to start)."""
    offered = found.controllers if isinstance(found, where.Found) else frozenset()
    why = (
        f"{found.root} does not offer the %s controller"
        if isinstance(found, where.Found)
        else f"there is {where.describe(found)}"
    )
    lines = []
    for q in queues:
        for key, controller in NEEDS.items():
            if getattr(q.resources, key) is not None and controller not in offered:
                lines.append(
                    f"queue {q.name}: resources.{key} needs a cgroup v2 with the {controller} "
                    f"controller, and {why.replace('%s', controller)}: run jobd under systemd "
                    "with Delegate=yes (docs: concepts/containment), set cgroup: to such a cgroup, "
                    f"or remove resources.{key}"
                )
    return lines
