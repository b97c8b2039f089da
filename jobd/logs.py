"""Logging to stderr; timestamps only when journald is not there to add its own."""

from __future__ import annotations

import logging
import os
import sys


def setup(level: str = "INFO") -> None:
    under_journald = bool(os.environ.get("JOURNAL_STREAM"))
    fmt = "%(levelname)s %(name)s: %(message)s"
    if not under_journald:
        fmt = "%(asctime)s " + fmt
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(fmt))
    root = logging.getLogger("jobd")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
