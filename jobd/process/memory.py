"""``resources.memory`` without a delegated cgroup: the resident memory of each capped handler's
tree, sampled, and the handlers over their cap.

A sample reads ``/proc/PID/stat`` of every process on the host once (its parent and its resident
pages) and sums, for each handler of a queue that sets ``resources.memory``, the resident memory
of its leader and every descendant of it, and of the processes that escaped its group (jobd's
children then, attributed to it by ``process.reaper``) and theirs. Only when such a handler
runs: a daemon whose queues set no memory cap never samples. The cost is one read per process on
the host per sample (``bench/memory_sampling.py`` measures it with 1000 handlers); a tree that
grows faster than the sampling interval can pass its cap for that long, which the kernel's own
limit (a cgroup's memory.max) does not allow: this is the fallback.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable

from jobd.process import procfs

PAGE = os.sysconf("SC_PAGE_SIZE")
SAMPLE_EVERY = 0.5  # seconds between two samples


def processes() -> tuple[dict[int, list[int]], dict[int, int]]:
    """Every process's children (by parent pid) and resident bytes (``procfs.scan``)."""
    children: dict[int, list[int]] = defaultdict(list)
    rss: dict[int, int] = {}
    for pid, found in procfs.scan().items():
        children[found.ppid].append(pid)
        rss[pid] = found.pages * PAGE
    return children, rss


def tree_rss(leader: int, children: dict[int, list[int]], rss: dict[int, int]) -> int:
    """The resident bytes of ``leader`` and all its descendants."""
    total, stack, seen = 0, [leader], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += rss.get(pid, 0)
        stack += children.get(pid, ())
    return total


def over(capped: Iterable[tuple[int, int, list[int]]]) -> list[tuple[int, int]]:
    """Of ``capped`` (leader pid, cap in bytes, the processes that escaped its group: see
    ``process.reaper``), those whose trees are over the cap: (leader, their resident bytes)."""
    capped = list(capped)
    if not capped:
        return []
    children, rss = processes()
    found = []
    for leader, cap, escaped in capped:
        used = sum(tree_rss(top, children, rss) for top in (leader, *escaped))
        if used > cap:
            found.append((leader, used))
    return found
