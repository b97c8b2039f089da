"""Review of issue 35 (workflows), round 8 (review35h) of ef1602b: workflows.hold writes a
wait's bound as ``math.ceil(timeout * 1000)`` (it was ``int``, to make a bound under 1 ms one),
but ``timeout`` is a float of seconds made from the flag's milliseconds, and the product is not
exact: `--after-timeout 2007ms` (2.007 s, 2.007 * 1000 == 2007.0000000000002) is written as
``timeout_ms`` 2008, and 731 of the bounds 1..99 999 ms are so (16.1s too: 16101 ms). The job
waits a millisecond longer than it was told, and the after hash says a bound the user never
gave. Low severity; ``max(1, round(...))`` (or ceil of a rounded value) keeps both. No daemon."""

from __future__ import annotations

import orjson
import redis
from support import jobd_cli

CONFIG = "redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n"


def test_a_bound_in_whole_ms_is_written_as_given(r: redis.Redis, write_config) -> None:
    c = str(write_config(CONFIG))
    out = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "h", "--after", "x",
                   "--after-timeout", "2007ms")  # fmt: skip
    assert out.returncode == 0, out.stderr
    spec = orjson.loads(r.hget("{jobd:a}:after", "h"))
    assert spec["timeout_ms"] == 2007, f"--after-timeout 2007ms written {spec['timeout_ms']} ms"
