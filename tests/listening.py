"""What the channel's tests share: a stand-in of a running handler, as ``daemon.channel`` needs
one (its pid, its session's id; its queue; ``heard``), which keeps what it heard."""

from __future__ import annotations

from types import SimpleNamespace


class Heard:
    def __init__(self, pid: int) -> None:
        self.pid, self.queue, self.said = pid, SimpleNamespace(name="q"), []
        self.stop_reason = None

    def heard(self, said, now: float) -> bool:
        self.said.append(said)
        return said.well
