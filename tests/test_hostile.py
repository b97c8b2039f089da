"""Hostile handlers and hostile entries: handled, logged, never a crash; other queues flow on."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import orjson
import psutil
import redis
from support import DaemonProcess, acked_all, pending_count, wait_until

Daemon = Callable[..., DaemonProcess]


def peak_rss(pid: int) -> int:
    """The process's high-water mark of resident memory (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def two_queues(bad: str, **bad_settings: object) -> str:
    """A config with a hostile queue ``bad`` and a healthy queue ``good`` beside it."""
    settings = "".join(f", {k}: {v}" for k, v in bad_settings.items())
    return (
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  bad: {{command: {bad}{settings}}}\n"
        "  good: {command: [./good.sh]}\n"
    )


def good_handler(script, tmp_path: Path) -> None:
    script("good.sh", f"#!/bin/sh\necho $(cat) >> {tmp_path}/good\n")


def assert_good_queue_flows(r: redis.Redis, tmp_path: Path, d: DaemonProcess) -> None:
    r.xadd("jobd:good", {"payload": "still-flowing"})
    wait_until(
        lambda: (tmp_path / "good").exists() and "still-flowing" in (tmp_path / "good").read_text()
    )
    assert d.proc.poll() is None
    assert "Traceback" not in d.log()


def test_64_mb_of_output_is_drained_within_50_mb_of_memory(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    good_handler(script, tmp_path)
    script(
        "flood.py",
        f"""
        #!{sys.executable}
        import os
        chunk = b"x" * 65535 + b"\\n"
        for _ in range(512):  # 32 MiB on each of stdout and stderr
            os.write(1, chunk)
            os.write(2, chunk)
        """,
    )
    d = daemon(write_config(two_queues("[./flood.py]")))
    wait_until(lambda: psutil.Process(d.proc.pid).memory_info().rss > 0)
    baseline = psutil.Process(d.proc.pid).memory_info().rss
    r.xadd("jobd:bad", {"payload": "flood"})
    wait_until(lambda: acked_all(r, "jobd:bad", 1), 60)
    grown = peak_rss(d.proc.pid) - baseline
    print(f"64 MiB of output: daemon peak RSS grew by {grown / 2**20:.1f} MiB")
    assert grown < 50 * 2**20
    d.wait_log("stdout: 33488896 more bytes not logged")
    assert len(d.log()) < 2 * 2**20, "truncated in the logs"
    assert_good_queue_flows(r, tmp_path, d)


def test_handlers_that_do_not_read_stdin(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    good_handler(script, tmp_path)
    script("ignores.sh", "#!/bin/sh\nsleep 0.2\n")
    script("closes.sh", "#!/bin/sh\nexec 0<&-\nsleep 0.2\n")
    config = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        "  ignores: {command: [./ignores.sh]}\n  closes: {command: [./closes.sh]}\n"
        "  good: {command: [./good.sh]}\n"
    )
    d = daemon(config)
    payload = b"p" * 2**20
    for _ in range(3):
        r.xadd("jobd:ignores", {"payload": payload})
        r.xadd("jobd:closes", {"payload": payload})
    wait_until(lambda: acked_all(r, "jobd:ignores", 3) and acked_all(r, "jobd:closes", 3))
    assert "error" not in d.log().lower()
    assert_good_queue_flows(r, tmp_path, d)


def test_payload_above_max_payload_is_dead_lettered_as_malformed(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    good_handler(script, tmp_path)
    script("never.sh", f"#!/bin/sh\ntouch {tmp_path}/ran\n")
    d = daemon(write_config(two_queues("[./never.sh]", max_payload="1KiB")))
    r.xadd("jobd:bad", {"payload": b"x" * 1025, "job_id": "too-big"})
    r.xadd("jobd:bad", {"payload": b"x" * 1024, "job_id": "just-fits"})
    wait_until(lambda: r.xlen("{jobd:bad}:dead") == 1)
    [(_, record)] = r.xrange("{jobd:bad}:dead")
    assert (record[b"jobd_job_id"], record[b"jobd_error"]) == (b"too-big", b"malformed")
    assert b"1025 bytes is above max_payload (1024)" in record[b"jobd_stderr"]
    wait_until(lambda: acked_all(r, "jobd:bad", 2) and pending_count(r, "jobd:bad") == 0)
    assert (tmp_path / "ran").exists(), "the job that fits ran"
    assert_good_queue_flows(r, tmp_path, d)


def test_garbage_in_reserved_fields_and_odd_entries(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    good_handler(script, tmp_path)
    script(
        "record.py",
        f"""
        #!{sys.executable}
        import json, os, sys
        with open("{tmp_path}/seen", "a") as f:
            f.write(json.dumps([os.environ["JOBD_JOB_ID"].encode("utf-8", "surrogateescape").hex(),
                                os.environ["JOBD_ATTEMPT"], sys.stdin.buffer.read().hex()]) + "\\n")
        """,
    )
    d = daemon(write_config(two_queues("[./record.py]")))
    entries = [
        {"payload": "a", "jobd_attempt": "-3"},
        {"payload": "b", "jobd_attempt": "9" * 5000},
        {"payload": "c", "jobd_attempt": b"\xff\xfe"},
        {"payload": "d", "jobd_job_id": b"nul\x00byte"},
        {"payload": "e", "job_id": ""},
        {"payload": ""},
        {b"\xff\xfename": b"\xc3\x28value"},
        {"payload": "f", "job_id": b"caf\xe9"},
    ]
    ids = [r.xadd("jobd:bad", fields).decode() for fields in entries]
    wait_until(lambda: acked_all(r, "jobd:bad", len(entries)) and pending_count(r, "jobd:bad") == 0)
    seen = [orjson.loads(line) for line in (tmp_path / "seen").read_text().splitlines()]
    by_stdin = {bytes.fromhex(s[2]): (bytes.fromhex(s[0]), s[1]) for s in seen}
    assert by_stdin[b"a"] == (ids[0].encode(), "1")
    assert by_stdin[b"b"] == (ids[1].encode(), "1")
    assert by_stdin[b"c"] == (ids[2].encode(), "1")
    assert by_stdin[b"d"] == (ids[3].encode(), "1"), "a job id with a NUL byte falls back"
    assert by_stdin[b"e"] == (ids[4].encode(), "1"), "an empty job id falls back"
    assert by_stdin[b""] == (ids[5].encode(), "1"), "an empty payload is 0 bytes on stdin"
    assert by_stdin[b"f"] == (b"caf\xe9", "1"), "a non-UTF-8 job id reaches the handler as bytes"
    odd = orjson.loads(next(k for k in by_stdin if k.startswith(b"{")))
    assert odd == {"\ufffd\ufffdname": "\ufffd(value"}
    log = d.log()
    assert "bad jobd_attempt" in log and "holds a NUL byte" in log
    assert_good_queue_flows(r, tmp_path, d)
