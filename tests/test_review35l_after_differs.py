"""Review of issue 35 (workflows), round 35l, defect 3: workflows.waited_for compared only the
jobs a held job waits for, not how it waits: `jobd enqueue --after d1 --after-any-outcome` (or
with another `--after-timeout`) of a job id held already `--after d1` exited 0, saying nothing,
though the job held would not run as this enqueue asked (dead-lettered `dependency` where the
operator asked it to run anyway, or waiting longer or shorter). Fixed: refused, exit 2, saying
what differs, as a re-send naming other jobs is, before its batch opens (no batch made); the
same command again is still that job (exit 0)."""

from __future__ import annotations

import orjson
import redis
from support import jobd_cli

CONFIG = (
    "redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n"
    "  cb:\n    command: [/bin/true]\n"
)
X = ("enqueue", "-c", "{c}", "a", "p", "--job-id", "x", "--after", "d1")


def _send(c: str, *extra: str):
    return jobd_cli(*(a.replace("{c}", c) for a in X), *extra)


def test_a_resend_differing_in_after_any_outcome_is_refused(r: redis.Redis, write_config) -> None:
    c = str(write_config(CONFIG))
    assert _send(c).returncode == 0
    out = _send(c, "--after-any-outcome", "--batch", "B", "--on-complete", "cb")
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert b"without --after-any-outcome, this enqueue with" in out.stderr, out.stderr
    assert not orjson.loads(r.hget("{jobd:a}:after", "x"))["any"]  # nothing changed
    assert jobd_cli("batch", "-c", c, "B").returncode == 3  # refused before B opened
    assert _send(c).returncode == 0  # the same command again: that job


def test_a_resend_differing_in_after_timeout_is_refused(r: redis.Redis, write_config) -> None:
    c = str(write_config(CONFIG))
    assert _send(c, "--after-timeout", "60s").returncode == 0
    out = _send(c, "--after-timeout", "120s")
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert b"bound to 60s, this enqueue to 120s" in out.stderr, out.stderr
    out = _send(c)  # no bound (the queue has no max_wait): not the hold's 60 s either
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert b"bound to 60s, this enqueue to no bound" in out.stderr, out.stderr
    assert orjson.loads(r.hget("{jobd:a}:after", "x"))["timeout_ms"] == 60000
    assert _send(c, "--after-timeout", "1m").returncode == 0  # the same bound: that job
