"""A thread's CPU time held to a share of a core: what a flood on the handlers' channel costs the
daemon at most, whatever its rate (``channel.Channel``'s thread rests; meanwhile the socket's
queue fills and the kernel blocks the senders)."""

from __future__ import annotations

import time


class Budget:
    """``share`` of a core over time, ``burst`` seconds of CPU time at once; made on, and
    spent by, the one thread it counts (``time.thread_time`` is the calling thread's)."""

    def __init__(self, share: float, burst: float) -> None:
        self.share, self.burst = share, burst
        self.cpu, self.at, self.left = time.thread_time(), time.monotonic(), burst

    def spend(self) -> float:
        """Seconds the thread should rest now: 0 while it is within its budget."""
        cpu, now = time.thread_time(), time.monotonic()
        self.left = min(self.burst, self.left + (now - self.at) * self.share) - (cpu - self.cpu)
        self.cpu, self.at = cpu, now
        return -self.left / self.share if self.left < 0 else 0.0
