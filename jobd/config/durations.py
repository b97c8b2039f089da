"""Durations as written in a config: ``250ms``, ``30s``, ``5m``, ``2h``, ``1d`` or seconds."""

import functools
import re

UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
PATTERN = r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)?\s*$"
_RE = re.compile(PATTERN)
HINT = "write a duration like 250ms, 30s, 5m, 2h, 1d, or a number of seconds"


def parse(value: str | int | float) -> float:
    """Seconds in ``value``; raises ValueError with a hint when it is not a duration."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration; {HINT}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"{value!r} is negative; {HINT}")
        return float(value)
    return _text(value)


@functools.lru_cache(maxsize=256)
def _text(value: str) -> float:
    """``parse`` of a string, remembered: a file of follow-ups says "1h" on every line (a
    regular expression per line was 6 % of its parse)."""
    match = _RE.match(value)
    if not match:
        raise ValueError(f"{value!r} is not a duration; {HINT}")
    number, unit = match.groups()
    return float(number) * UNITS[unit or "s"]


def format(seconds: float) -> str:
    """The shortest exact spelling of ``seconds`` in config syntax."""
    for unit in ("d", "h", "m", "s"):
        size = UNITS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{round(seconds * 1000)}ms" if seconds < 1 else f"{seconds:g}s"
