"""Safe defaults (docs/reference/defaults.md): every queue's stream is bounded unless the
operator writes ``retention: {maxlen: unbounded}``, `jobd validate` lists each queue's effective
settings and its worst case in Redis, and that worst case holds against a real daemon.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, acked_all, jobd_cli, wait_group, wait_until

from jobd.config import load
from jobd.config.footprint import worst_case
from jobd.config.schema import QUEUE_DEFAULTS

Daemon = Callable[..., DaemonProcess]
ROOT = Path(__file__).resolve().parent.parent


def enqueue_many(r: redis.Redis, stream: str, count: int, payload: bytes = b"x") -> None:
    """``count`` jobs XADDed as any producer would, a thousand a round trip."""
    for first in range(0, count, 1000):
        pipe = r.pipeline(transaction=False)
        for _ in range(first, min(count, first + 1000)):
            pipe.xadd(stream, {"payload": payload})
        pipe.execute()


def test_every_queue_has_a_retention_by_default(write_config: Callable[..., Path]) -> None:
    path = write_config("redis: {url: '{redis}'}\nqueues:\n  q: {command: [/bin/true]}\n")
    assert QUEUE_DEFAULTS["retention"] == {"maxlen": 1000}
    assert load(str(path)).queues["q"].retention_maxlen == 1000


def test_unbounded_is_said_in_so_many_words(write_config: Callable[..., Path]) -> None:
    path = write_config(
        "redis: {url: '{redis}'}\n"
        "queues:\n  q: {command: [/bin/true], retention: {maxlen: unbounded}}\n"
    )
    q = load(str(path)).queues["q"]
    assert q.retention_maxlen is None and worst_case(q).total is None
    text = jobd_cli("validate", str(path)).stdout.decode()
    assert "queue q: worst case in Redis unbounded" in text


def test_default_retention_bounds_the_stream(
    r: redis.Redis, write_config: Callable[..., Path], daemon: Daemon
) -> None:
    """2 500 jobs through a queue that says nothing of retention: its stream ends near 1 000
    entries, every job done."""
    path = write_config(
        "redis: {url: '{redis}'}\nqueues:\n  q: {command: [/bin/true], concurrency: 8}\n"
    )
    daemon(path)
    wait_group(r, "jobd:q")
    enqueue_many(r, "jobd:q", 2500)
    wait_until(lambda: acked_all(r, "jobd:q", 2500), 120, "every job done")
    wait_until(lambda: r.xlen("jobd:q") <= 1000, what="the stream trimmed to its retention")


def test_validate_json_lists_effective_settings_and_worst_case() -> None:
    result = jobd_cli("validate", "--format", "json", str(ROOT / "config" / "example.yaml"))
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    assert set(body["queues"]) == {"greetings", "reports", "words"}
    reports = body["queues"]["reports"]
    settings = reports["effective"]
    assert settings["timeout"] == 300 and settings["concurrency"] == 4  # its own
    assert settings["retry"]["max_backoff"] == 60  # from the file's defaults
    assert settings["retention"] == {"maxlen": 1000}  # the built-in default
    assert settings["history"] == {"max_age": 7 * 86400, "maxlen": 5000, "output": 1024,
                                   "events": 10000}  # fmt: skip
    assert settings["env"] == sorted(settings["env"]) and "EXAMPLE_STATE" in settings["env"]
    worst = reports["worst_case"]
    parts = worst["history"] + worst["events"] + worst["dead_letters"] + worst["stream"]
    assert worst["bytes"] == parts <= 528 * 2**20  # the budget docs/reference/defaults.md states
    assert worst["kept_payloads"] > 1000 and worst["max_payload"] == 16 * 2**20


def test_validate_text_prints_each_queues_worst_case() -> None:
    result = jobd_cli("validate", str(ROOT / "config" / "example.yaml"))
    lines = result.stdout.decode().splitlines()
    for name in ("greetings", "reports", "words"):
        assert any(line.startswith(f"queue {name}: worst case in Redis at most ") for line in lines)


def memory(r: redis.Redis, key: str) -> int:
    return int(r.memory_usage(key, samples=0) or 0)


def test_worst_case_holds_against_a_daemon(
    r: redis.Redis, write_config: Callable[..., Path], script, daemon: Daemon
) -> None:
    """Jobs that fail every attempt with their output tails full (the worst case per job), in
    two rounds of as many as the history keeps (the first round's records go as the second's
    come): each part of the queue's memory stays within its estimate."""
    handler = script("fail.sh", "#!/bin/sh\nhead -c 5000 /dev/zero | tr '\\0' o\n"
                     "head -c 5000 /dev/zero | tr '\\0' e >&2\nexit 1\n")  # fmt: skip
    path = write_config(f"""\
        redis: {{url: '{{redis}}'}}
        queues:
          q:
            command: [{handler}]
            concurrency: 8
            retry: {{max_attempts: 3, backoff: 1ms, max_backoff: 1ms, jitter: 0}}
            history: {{maxlen: 40, output: 1KiB, events: 50}}
            dead_letter: {{maxlen: 30}}
            retention: {{maxlen: 50}}
        """)
    q = load(str(path)).queues["q"]
    daemon(path)
    wait_group(r, "jobd:q")
    for done in (120, 240):  # 3 attempts each, every retry a new entry
        enqueue_many(r, "jobd:q", 40, b"p" * 100)
        wait_until(lambda done=done: acked_all(r, "jobd:q", done) and r.zcard(q.keys.delayed) == 0, 120,
                   "every attempt made")  # fmt: skip
    wait_until(lambda: r.xlen("jobd:q") <= 50, what="the stream trimmed")
    assert r.zcard(q.keys.history_at) == 40
    assert all(v.count(b"\n") == 4 for _, v in r.hscan_iter(q.keys.history))  # 3 runs, 2 promotions
    worst = worst_case(q)
    history = memory(r, q.keys.history) + memory(r, q.keys.history_at)
    payloads = 100 + 16  # a payload and its field's name
    measured = {"history": history, "events": memory(r, q.keys.events),
                "dead_letters": memory(r, q.dead_letter.stream) - 30 * payloads,
                "stream": memory(r, "jobd:q") - r.xlen("jobd:q") * payloads}  # fmt: skip
    print(measured, worst)
    for part, used in measured.items():
        bound = getattr(worst, part)
        assert used <= bound, f"{part}: {used} bytes, over its worst case {bound}"


def test_validates_worst_case_holds_with_results_kept_in_the_history(
    r: redis.Redis, write_config: Callable[..., Path], script, daemon: Daemon
) -> None:
    """The history's worst case counts each done record's result, which it keeps whole, up to
    result_max (as base64 when it is not UTF-8), alone when larger than a job's 64 KiB: 20
    jobs of 1 MiB results hold ~30 MiB (review 6: estimated at a few KiB a job)."""
    handler = script("big.sh", '#!/bin/sh\nhead -c 1048576 /dev/urandom > "$JOBD_RESULT"\n')
    path = write_config(
        "redis: {url: '{redis}'}\nqueues:\n  q:\n"
        f"    command: [{handler}]\n    concurrency: 4\n    result_max: 1MiB\n"
        "    history: {maxlen: 20}\n"
    )
    q = load(str(path)).queues["q"]
    daemon(path)
    for i in range(20):
        r.xadd("jobd:q", {"payload": "x", "job_id": f"j{i}"})
    wait_until(lambda: r.zcard(q.keys.history_at) == 20, 60, "20 jobs done")
    used = memory(r, q.keys.history) + memory(r, q.keys.history_at)
    print(used, worst_case(q).history)
    assert used <= worst_case(q).history
