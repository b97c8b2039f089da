"""Review 35w of issue 35 (medium): one handler's JOBD_ENQUEUE file, within every documented
bound, blocks Redis for seconds in the parent's settle.lua: every client (every daemon of
every queue, every producer, the dashboard) gets ``BUSY Redis is busy running a script``
meanwhile, and the script cannot be killed (it has written).

What is wrong: the bounds of a file are its size (process/followups.py MAX_BYTES, 64 MiB), its
jobs (max_follow_ups, 10 000) and, per job, nothing (review 35w's wide follow-up: it should be
MAX_FIELDS, 1 000); none bounds the values settle.lua is handed. A file of short fields
(`"aa":""`, 8 bytes each) is some 8 million field names and values, all passed as ARGV of one
settle.lua call (lib/jobs.lua ``follow_ups_at`` copies each into a table, ``add_job`` one XADD a
follow-up) on one Redis; on a cluster the same call packs them (cmsgpack) into the outbox.
Measured here: 63 MiB (8 301 lines of 990 fields): SLOWLOG 5.88 s, 38 BUSY replies to a
client polling meanwhile, daemon duties failing ("forwarding due jobs of queue p failed",
"retention of queue p failed"); 12 MiB: 0.41 s; this test's 32 MiB: 1.92 s. A handler need
not be trusted with Redis (issue 35: "without the handler ever touching Redis"), yet it can
stall it for every queue.

Reproduce: a handler that exits 0 having written 32 MiB of lines `{"queue":"t","payload":"",
"fields":{"aa":"","ab":"",… 990 names}}` into $JOBD_ENQUEUE; one daemon; `jobd enqueue p x
--job-id p1`; SLOWLOG GET once p1's record says done.

What should happen: settling one job costs Redis milliseconds to a few hundred at most, not
seconds (asserted: < 1 s, as review 35v's bound for one script call). Suggested fix: bound
what one file sends, e.g. the sum over its jobs of their fields (a FollowUpError past some
100 000 values, the parent dead-lettered `enqueue` with the reason), and keep MAX_BYTES for
payload bytes; or, keeping big files, write the follow-ups as one packed outbox entry in
settle.lua (one XADD, one value: the ack stays atomic with them) and let movers add them in
chunks, each chunk once by its marks, as on a cluster.

Fixed (fixer f35wa): the queue key ``max_follow_ups_bytes`` (default 8 MiB) bounds what a
file's jobs hold together, each field counted as 128 bytes at least (process/followups.py
``weight``): this file (some 480 MiB so counted) dead-letters its parent `enqueue` at its 66th
line, nothing written. At the bound the bytes and fields cost 15-35 ms (bench/follow_ups_cost.py); a job
whose follow-ups take a settle.lua call past 4096 fields gets a call of its own
(store/outcomes.py CALL_FIELDS), so parents settled together do not add up. (Since fixer
f35y: a call of its own past one file's max_follow_ups_bytes by the same weight, or its
max_follow_ups jobs; CALL_FIELDS is gone.)
"""

from __future__ import annotations

import itertools
import json
import string
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli, wait_until

Daemon = Callable[..., DaemonProcess]


def test_one_follow_up_file_does_not_block_redis_for_seconds(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    names = ["".join(p) for p in itertools.product(string.ascii_letters, repeat=2)][:990]
    line = json.dumps({"queue": "t", "payload": "", "fields": dict.fromkeys(names, "")},
                      separators=(",", ":"))  # fmt: skip
    lines = tmp_path / "follow-ups"
    lines.write_text((line + "\n") * ((32 * 2**20) // (len(line) + 1)))  # 32 MiB, 4 000 lines
    parent = script("parent.sh", f'#!/bin/sh\ncat > /dev/null\ncat {lines} > "$JOBD_ENQUEUE"\n')
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  p:\n    command: [{parent}]\n"
        "  t:\n    command: [/bin/true]\n"
    )
    r.config_set("slowlog-log-slower-than", 100_000)  # µs: calls of 0.1 s and more
    r.slowlog_reset()
    daemon(cfg)
    assert jobd_cli("enqueue", "-c", str(cfg), "p", "x", "--job-id", "p1").returncode == 0

    def settled() -> bool:
        try:
            return r.hget("{jobd:p}:history", "p1") is not None
        except redis.exceptions.BusyLoadingError:
            return False
        except redis.ResponseError as exc:  # BUSY: a script runs
            assert "BUSY" in str(exc), exc
            return False

    wait_until(settled, 180, what="p1 settled")
    slow = [(e["duration"] / 1e6, e["command"][:60]) for e in r.slowlog_get(20)]
    assert all(seconds < 1 for seconds, _ in slow), slow
