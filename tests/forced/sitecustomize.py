"""Test-only: prefetch forced on. With ``JOBD_TEST_PREFETCH=N`` in the environment, every queue
whose config does not set ``prefetch`` (itself or in ``defaults``) reads up to N entries ahead,
whatever its handlers' run times (an explicit N is not adaptive: see ``jobd.daemon.prefetch``).

Python imports this module at start-up from ``PYTHONPATH``, which ``tests/conftest.py`` sets
when the variable is given, so the daemons the tests start (and their reloads) get it; the
tests' own process gets it from conftest. Handlers never do: they get a small environment.

    JOBD_TEST_PREFETCH=4 .venv/bin/pytest tests/test_leases.py
"""

from __future__ import annotations

import os
from dataclasses import replace


def force_prefetch(ahead: int) -> None:
    """Queues that do not set ``prefetch`` read up to ``ahead`` entries ahead."""
    from jobd.config import build
    from jobd.config.queue_settings import QueueSettings
    from jobd.config.types import QueueConfig

    original = build.build_queue
    if getattr(original, "forced", False):
        return

    def build_queue(q: QueueSettings) -> QueueConfig:
        queue = original(q)
        if "prefetch" in q.own or q.inherited(("prefetch",)) is not None:
            return queue
        levels = tuple(replace(level, prefetch=ahead) for level in queue.levels)
        return replace(queue, prefetch=ahead, levels=levels)

    build_queue.forced = True  # type: ignore[attr-defined]
    build.build_queue = build_queue


if os.environ.get("JOBD_TEST_PREFETCH"):
    force_prefetch(int(os.environ["JOBD_TEST_PREFETCH"]))
