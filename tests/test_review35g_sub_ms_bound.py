"""Review of issue 35 (workflows), round 8 (review35g): b9df72d refuses a wait's bound of 0 or
less ("0 or less was taken by the producer (due at once)") with check_after_timeout ("more
than 0"), but workflows.hold then writes ``int(timeout * 1000)``: any bound under a
millisecond that the check takes (`--after-timeout 0.4ms`, a valid duration; Python's
``after_timeout=1e-9``) is written as ``timeout_ms`` 0, the very bound refused, and hold.lua
scores it ``now + 0`` in held:until: due at once, the job dead-lettered `dependency` at the
next pass (a bound's check and its use disagree; either refuse under 1 ms or round up). No
daemon: the after hash hold.lua wrote is read."""

from __future__ import annotations

import orjson
import redis
from support import jobd_cli

CONFIG = "redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n"


def test_a_bound_the_check_takes_is_not_written_as_zero(r: redis.Redis, write_config) -> None:
    c = str(write_config(CONFIG))
    out = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "h", "--after", "x",
                   "--after-timeout", "0.4ms")  # fmt: skip
    if out.returncode == 2:  # refused as a usage error: fine
        return
    assert out.returncode == 0, out.stderr
    spec = orjson.loads(r.hget("{jobd:a}:after", "h"))
    assert spec["timeout_ms"] > 0, "a bound 'more than 0' held as 0 ms: due at once"
