"""Review 36h of issue 36: the dashboard's requeue reads every dead letter whole into the
process serving the page (the daemon's own, on ``metrics.listen``).

``POST /api/dead-letters/requeue {all: true}`` (Requeue all) and ``{ids}`` (Requeue selected,
1 000 ids a request) go through ``dlq.requeue_existing`` / ``dlq.requeue``: each page of records
(``dlq.SCAN_CHUNK`` = 500; or the 1 000 ids in one pipeline, ``dead_letters_by_id``) is XRANGEd
whole into Python, then sent back whole as ``requeue.lua``'s arguments. Nothing bounds it: 16
records of 8 MiB raised the dashboard's peak RSS from 55 MiB to 199 MiB in one click. A
dead letter is as large as its job's entry (a queue with a large ``max_payload``; an oversize
entry dead-lettered ``malformed`` with its fields), so one Requeue all of 500 records of
64 MiB asks the daemon for 32 GiB and more: the kernel's OOM killer ends the daemon and its
running jobs, from a button of the page that reads everything else within 1 MiB a request. The
daemon's own reads are bounded (``job.ENTRY_SLACK``: a read brings count × max_payload at
most); this path is not.

What should happen: a requeue moves records without their payloads leaving Redis (the script
takes record ids and reads each record itself), or in pages bounded in bytes; the serving
process's memory does not grow with the records' size.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from support import jobd_cli
from test_dashboard_security import csrf, dashboard, peak_rss_kib, request, with_token

from jobd import config as jobd_config
from jobd.store.admin import FIND_CHUNK

__all__ = ["dashboard"]  # the fixture, imported

RECORDS = 16
PAYLOAD = 8 << 20  # bytes of each record's payload: 128 MiB in all
GROWTH_KIB = 64 << 10  # the serving process's peak RSS may grow this much at most


def _records(r: redis.Redis, config: Path) -> tuple[Any, list[str]]:
    q = jobd_config.load(str(config)).queues["q"]
    ids = [
        r.xadd(q.dead_letter.stream,
               {"jobd_job_id": f"j{n}", "jobd_error": "failed", "payload": b"p" * PAYLOAD}).decode()
        for n in range(RECORDS)
    ]  # fmt: skip
    return q, ids


def _requeue(port: int, body: dict[str, Any]) -> tuple[int, bytes]:
    headers = {**csrf(port), "Content-Type": "application/json"}
    code, _, reply = request(
        port, "/api/dead-letters/requeue", "POST", headers, json.dumps(body).encode(), timeout=60
    )
    return code, reply


def test_requeue_all_reads_every_record_whole(
    r: redis.Redis, write_config: Any, tmp_path: Path, dashboard: Callable[[Path], tuple[int, int]]
) -> None:
    config = with_token(write_config, tmp_path)
    q, _ = _records(r, config)
    port, pid = dashboard(config)
    before = peak_rss_kib(pid)
    code, reply = _requeue(port, {"queue": "q", "all": True})
    grown = peak_rss_kib(pid) - before
    assert code == 200 and r.xlen(q.stream) == RECORDS, reply[:200]
    assert grown < GROWTH_KIB, f"Requeue all grew the serving process by {grown >> 10} MiB"


def test_requeue_selected_reads_every_record_whole(
    r: redis.Redis, write_config: Any, tmp_path: Path, dashboard: Callable[[Path], tuple[int, int]]
) -> None:
    config = with_token(write_config, tmp_path)
    q, ids = _records(r, config)
    port, pid = dashboard(config)
    before = peak_rss_kib(pid)
    code, reply = _requeue(port, {"queue": "q", "ids": ids})
    grown = peak_rss_kib(pid) - before
    assert code == 200 and r.xlen(q.stream) == RECORDS, reply[:200]
    assert grown < GROWTH_KIB, f"Requeue selected grew the serving process by {grown >> 10} MiB"


# `jobd dlq requeue REF…` run from a wrapper that says the most memory its child held.
PEAK = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run([sys.executable, '-m', 'jobd', *sys.argv[1:]])\n"
    "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
)
CLI_PEAK_KIB = 96 << 10  # the CLI's peak RSS at most (about 40 MiB here; 190 MiB before)


def test_dlq_requeue_by_job_id_reads_no_record(
    r: redis.Redis, write_config: Any, tmp_path: Path
) -> None:
    """`jobd dlq requeue` of a job id looked for the record in pages of 500 records read whole
    (here all 16, 128 MiB, to find the oldest): now in Redis, and only ids go back."""
    config = with_token(write_config, tmp_path)
    q, ids = _records(r, config)
    run = subprocess.run(
        [sys.executable, "-c", PEAK, "dlq", "-c", str(config), "q", "requeue", "j0", ids[-1]],
        capture_output=True, env={**os.environ, "PYTHONPATH": os.getcwd()}, timeout=60,
    )  # fmt: skip
    code, peak = run.stdout.split()[-2:]
    assert int(code) == 0 and r.xlen(q.stream) == 2, run
    assert int(peak) < CLI_PEAK_KIB, f"the CLI held {int(peak) >> 10} MiB"
    assert r.xlen(q.dead_letter.stream) == RECORDS - 2


def test_dlq_finds_a_job_id_behind_more_records_than_one_call_visits(
    r: redis.Redis, write_config: Any, tmp_path: Path
) -> None:
    """The search goes on past one call's records (``admin.FIND_CHUNK``), newest first."""
    config = with_token(write_config, tmp_path)
    q = jobd_config.load(str(config)).queues["q"]
    pipe = r.pipeline(transaction=False)
    for n in range(FIND_CHUNK + 100):
        pipe.xadd(
            q.dead_letter.stream, {"jobd_job_id": "old" if n < 2 else f"j{n}", "payload": "x"}
        )
    _, second, *_ = pipe.execute()
    shown = jobd_cli("dlq", "-c", str(config), "q", "show", "old", "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["id"] == second.decode(), shown
    done = jobd_cli("dlq", "-c", str(config), "q", "requeue", "old", "nothing-of-the-kind")
    assert done.returncode == 3 and r.xlen(q.stream) == 0, done  # one missing: none requeued
    done = jobd_cli("dlq", "-c", str(config), "q", "requeue", "old", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["requeued"] == [second.decode()], done
