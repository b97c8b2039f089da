"""Which containment applies on this host, in words: what `jobd validate` and the daemon's
startup log say (see the README's Containment)."""

from __future__ import annotations

from collections.abc import Iterable

from jobd.config import QueueConfig
from jobd.process import memory


def describe(queues: Iterable[QueueConfig], subreaper: bool = True) -> list[str]:
    """The summary first; then a line for the queues whose memory is capped, if any."""
    escaped = (
        "processes that leave it are ended with their job (jobd is a child subreaper)"
        if subreaper
        else "processes that leave it may outlive their job (Linux refused a child subreaper)"
    )
    lines = [f"containment: each handler in a process group of its own; {escaped}"]
    capped = [q.name for q in queues if q.resources.memory is not None]
    if capped:
        lines.append(
            f"resources.memory of {', '.join(capped)}: each handler's tree's resident memory, "
            f"sampled every {memory.SAMPLE_EVERY:g}s (jobd places no handler in a cgroup yet)"
        )
    return lines
