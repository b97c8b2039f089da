"""An `on_dead_letter` hook's job fits its queue's `max_payload` (docs/workflows.md, "Failure
hook"): the record's JSON has its values cut to fit, each one cut named in `clipped`, the
record whole in the dead-letter stream; a record that cannot fit even with its values cut to
nothing is not sent and says so (`jobd_on_dead_letter`); `jobd validate` refuses a hook queue
whose max_payload is under 1 KiB. Through a real daemon, for a job a handler failed
(dead_letter.lua, store/chains.py) and for a held job dead-lettered `dependency`
(unblock.lua, lib/chains.lua)."""

from __future__ import annotations

import json
from pathlib import Path

import redis
from support import jobd_cli, wait_until
from test_after_batches import RUNS, Daemon

FAILS = "#!/bin/sh\ncat >/dev/null\necho 'it broke' >&2\nexit 1\n"
# The hook's handler: its payload, whole, into a file named after its job id.
KEEPS = '#!/bin/sh\ncat > "$(dirname "$0")/alert.$JOBD_JOB_ID"\n'


def config(write_config, script, most: str) -> Path:
    return write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  a:\n    command: [{script('fails.sh', FAILS)}]\n    retry: {{max_attempts: 1}}\n"
        "    on_dead_letter: {queue: alerts}\n"
        f"  b:\n    command: [{script('runs.sh', RUNS)}]\n    retry: {{max_attempts: 1}}\n"
        f"  alerts:\n    command: [{script('keeps.sh', KEEPS)}]\n    max_payload: {most}\n"
    )


def alert(tmp_path: Path, job_id: str) -> dict:
    path = tmp_path / f"alert.{job_id}"
    wait_until(lambda: path.exists() and path.stat().st_size > 0, what=f"{job_id}'s alert ran")
    raw = path.read_bytes()
    assert len(raw) <= 2048, f"{len(raw)} bytes, above the hook queue's max_payload"
    return json.loads(raw)


def test_a_failed_jobs_record_is_cut_to_fit_the_hook_queues_max_payload(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    cfg = config(write_config, script, "2KiB")
    daemon(cfg)
    payload = "x" * 3000
    assert jobd_cli("enqueue", "-c", str(cfg), "a", payload, "--job-id", "j").returncode == 0
    sent = alert(tmp_path, "j.dead")
    assert "payload 3000" in sent["clipped"]
    assert payload.startswith(sent["fields"]["payload"]) and sent["fields"]["payload"]
    assert sent["fields"]["jobd_stderr"].startswith("it broke")  # short values are whole
    ((rid, record),) = r.xrange("{jobd:a}:dead")
    assert sent["id"] == rid.decode() and record[b"payload"] == payload.encode()
    assert b"jobd_on_dead_letter" not in record


def test_a_held_jobs_record_is_cut_to_fit_the_hook_queues_max_payload(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    cfg = config(write_config, script, "2KiB")
    payload = "w" * 3000
    out = jobd_cli("enqueue", "-c", str(cfg), "a", payload, "--job-id", "w", "--after", "b:x")
    assert out.returncode == 0, out.stderr
    assert jobd_cli("enqueue", "-c", str(cfg), "b", "fail", "--job-id", "x").returncode == 0
    daemon(cfg)
    sent = alert(tmp_path, "w.dead")
    assert sent["fields"]["jobd_error"] == "dependency"
    assert "payload 3000" in sent["clipped"] and payload.startswith(sent["fields"]["payload"])
    ((_, record),) = r.xrange("{jobd:a}:dead")
    assert record[b"payload"] == payload.encode() and b"jobd_on_dead_letter" not in record


def test_a_record_too_wide_to_fit_is_not_sent_and_says_why(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    cfg = config(write_config, script, "1KiB")
    fields = {"payload": "p", "job_id": "wide"}
    fields.update({f"a_field_of_a_wide_job_{i:03}": "v" for i in range(100)})
    r.xadd("jobd:a", fields)  # a producer's job of 102 fields: its record's JSON is wider
    daemon(cfg)
    wait_until(lambda: r.exists("{jobd:a}:dead") and r.xlen("{jobd:a}:dead") == 1, what="dead")
    ((_, record),) = r.xrange("{jobd:a}:dead")
    why = record.get(b"jobd_on_dead_letter", b"").decode()
    assert why.startswith("not enqueued: queue alerts's max_payload (1024)"), record
    assert r.xlen("jobd:alerts") == 0, "written with the record, or not at all"


def test_validate_refuses_a_hook_queue_whose_max_payload_is_under_1kib(
    write_config, script
) -> None:
    cfg = config(write_config, script, "512")
    out = jobd_cli("validate", "-c", str(cfg))
    err = out.stderr.decode() + out.stdout.decode()
    assert out.returncode == 78, err
    assert "on_dead_letter" in err and "max_payload of 1KiB or more" in err, err


def test_a_held_record_too_wide_to_fit_is_not_sent_and_says_why(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    from jobd.config import load
    from jobd.newjob import NewJob
    from jobd.producer import enqueue_job

    cfg = config(write_config, script, "1KiB")
    wide = {f"a_field_of_a_wide_job_{i:03}": "v" for i in range(100)}
    enqueue_job(load(str(cfg)), "a", NewJob(b"p", "w", fields=wide, after=(("b", "x"),)))
    assert r.hexists("{jobd:a}:held", "w")
    assert jobd_cli("enqueue", "-c", str(cfg), "b", "fail", "--job-id", "x").returncode == 0
    daemon(cfg)
    wait_until(lambda: r.exists("{jobd:a}:dead") and r.xlen("{jobd:a}:dead") == 1, what="dead")
    ((_, record),) = r.xrange("{jobd:a}:dead")
    assert record[b"jobd_error"] == b"dependency"
    why = record.get(b"jobd_on_dead_letter", b"").decode()
    assert why.startswith("not enqueued: queue alerts's max_payload (1024)"), record
    assert r.xlen("jobd:alerts") == 0, "written with the record, or not at all"
