"""Sizes as written in a config: a number of bytes, or ``512KiB``, ``16MiB``, ``1GiB``, ``1MB``."""

import re

UNITS = {
    "B": 1,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
}
_RE = re.compile(r"^\s*([0-9]+)\s*(B|KiB|MiB|GiB|KB|MB|GB)?\s*$")


def parse(value: str | int) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _RE.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a size; write bytes, or 512KiB, 16MiB, 1GiB")
    return int(match.group(1)) * UNITS[match.group(2) or "B"]
