"""Review 34e: where handlers have cgroups, a stranger's message costs the channel's thread time
in proportion to the number of running handlers, all of it in Python with the GIL held.

``Channel.judge`` gives every message whose session is no running handler's (a stranger's:
any local process can send on the abstract socket) to ``cgroup_of`` (the handlers' cgroup
finder) with the cgroup path ``receive`` read, and it copied the table (``running()``) and
normalised every running handler's cgroup path, for each message. Measured: about 2.5 µs
with one handler running, 100 µs with 100, 270 µs with 500 — a flood of a few thousand
messages a second from any user keeps the channel's thread busy in Python, taking the GIL
from the loop at every switch interval (what the C reader was built to avoid: the loop lost a
quarter of its throughput to a thread that took the GIL often). The cost of a stranger's
message should not grow with the jobs running: ``handlers.CgroupFinder`` keeps an index by
path as handlers enter and leave the table, and a lookup never walks it.

The real finder over stand-ins of running handlers (their cgroup, as ``Handler.placed`` holds
it); no Redis. The work is counted (a look at a handler's cgroup during a lookup), and the
time of a lookup with 1 and 500 handlers compared with a generous bound."""

from __future__ import annotations

import time
from types import SimpleNamespace

from jobd.daemon import handlers

MOUNT = "/sys/fs/cgroup"
STRANGER = b"/user.slice/user-1000.slice/stranger.scope"


class Running:
    """A stand-in of a running handler in cgroup ``path``; counts the looks at its cgroup."""

    looks = 0

    def __init__(self, path: str) -> None:
        self._placed = (None, SimpleNamespace(path=path))

    @property
    def placed(self):
        Running.looks += 1
        return self._placed


def finder(running: int, monkeypatch) -> tuple[handlers.CgroupFinder, list[Running]]:
    monkeypatch.setattr(handlers.where, "mount_point", lambda: MOUNT)
    table = [Running(f"{MOUNT}/jobd/q/jobd-{i}") for i in range(running)]
    of = handlers.CgroupFinder()
    for handler in table:
        of.enter(handler)  # type: ignore[arg-type]
    return of, table


def cost(running: int, monkeypatch) -> float:
    """Seconds a lookup of a stranger's cgroup path takes, with ``running`` handlers."""
    of, _ = finder(running, monkeypatch)
    best = float("inf")
    for _ in range(7):
        began = time.perf_counter()
        for _ in range(200):
            assert of(STRANGER) is None
        best = min(best, (time.perf_counter() - began) / 200)
    return best


def test_a_strangers_message_costs_the_same_whatever_the_number_of_handlers(monkeypatch):
    of, table = finder(500, monkeypatch)
    Running.looks = 0
    for _ in range(100):
        assert of(STRANGER) is None
        assert of(b"/elsewhere/jobd/q/jobd-7") is None  # a cgroup only named like a job's
        assert of(b"/jobd/q/jobd-7") is table[7]
        assert of(b"/jobd/q/jobd-7/below/it") is table[7]
        assert of(b"/jobd/q/jobd-70") is table[70]  # not jobd-7's
    assert Running.looks == 0, f"{Running.looks} looks at handlers' cgroups in 500 lookups"
    one, many = cost(1, monkeypatch), cost(500, monkeypatch)
    assert many < 10 * one, f"{one * 1e6:.1f} µs with 1 handler, {many * 1e6:.1f} µs with 500"


def test_a_handler_that_left_is_found_no_more(monkeypatch):
    of, table = finder(3, monkeypatch)
    of.leave(table[1])  # type: ignore[arg-type]
    assert of(b"/jobd/q/jobd-1") is None
    assert of(b"/jobd/q/jobd-2") is table[2]
    for handler in (table[0], table[2]):
        of.leave(handler)  # type: ignore[arg-type]
    assert of.by_path == {} and of.depths == ()
    again = Running(f"{MOUNT}/jobd/q/jobd-1")
    of.enter(again)  # type: ignore[arg-type]
    of.leave(table[1])  # type: ignore[arg-type]  # an earlier one of that path: not again's
    assert of(b"/jobd/q/jobd-1") is again
