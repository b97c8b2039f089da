"""Review 35t of issue 35: 8855d5b copies a job's jobd_batch into its dead letter, and into the
``on_dead_letter`` job's JSON of it (store/chains.py KEPT, ``_kept``), by its length alone
("no longer than jobd writes it": 800 bytes), not by the rule 43e4970 gave every other place a
batch is named: a batch id `enqueue --batch` takes (jobd.job.is_batch_id, lib/jobs.lua
batch_id_ok). A jobd_batch of someone's XADD that is not UTF-8 — the byte 0xff — is then in the
hook's JSON (and in `jobd dlq show --json`, the same JSON) as the text ``\\xff``, which is
a legal batch id, someone else's: the alerting handler that runs `jobd batch
"$(jq -r .fields.jobd_batch)"` (or links it) reports on a batch the job never was a member of
— exactly what 43e4970 and docs/workflows.md rule out ("a jobd_batch field that is no batch id
jobd takes … is named in no record nor event …: shown escaped, the byte 0xff would read as
\\xff, another batch's id"). Before 8855d5b neither the dead letter nor the JSON had it.

Reproduce: a real batch legally named ``\\xff`` (four characters); someone XADDs a failing job
with ``jobd_batch`` = the byte 0xff into a queue with ``on_dead_letter: {queue: alerts}``; a
daemon dead-letters it (no record links a batch: the daemon knows it is none); read the alert.

What should happen: a jobd_batch that is no batch id is not kept as the job's batch in its dead
letter nor in the hook's JSON of it (as dead_letter.lua's record and chains.py's JSON agree);
the job's own records link none, its batch ``\\xff`` is untouched.

Fixed (dead_letter.lua KEPT, store/chains.py KEPT): jobd_batch is kept only when it is a batch
id, by the one rule of every batch link (lib/jobs.lua ``batch_id_ok``, jobd.job
``is_batch_id``, which now hold the length bound too), so neither the dead letter nor the hook's
JSON names it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import orjson
import redis
from support import DaemonProcess, jobd_cli, wait_until

Daemon = Callable[..., DaemonProcess]

CONFIG = """\
redis: {url: '{redis}'}
queues:
  a:
    command: [/bin/false]
    retry: {max_attempts: 1}
    on_dead_letter: {queue: alerts}
  alerts: {command: [/bin/true]}
  cb: {command: [/bin/true]}
"""


def test_the_hooks_json_names_no_batch_that_is_no_batch_id(
    r: redis.Redis, write_config, daemon: Daemon, tmp_path: Path
) -> None:
    path = write_config(CONFIG)
    cfg = str(path)
    # someone else's batch, legally named with the four characters \xff
    out = jobd_cli("enqueue", "-c", cfg, "cb", "x", "--job-id", "theirs",
                   "--batch", "\\xff", "--on-complete", "cb")  # fmt: skip
    assert out.returncode == 0, out.stderr
    daemon(path)
    r.xadd("jobd:a", {"payload": "x", "job_id": "d", "jobd_batch": b"\xff"})
    wait_until(lambda: r.xlen("jobd:alerts") == 1, what="the alert")
    assert b"batch" not in (r.hget("{jobd:a}:history", "d") or b"x"), "its record links a batch"
    [(_, letter)] = r.xrange("{jobd:a}:dead")
    [(_, alert)] = r.xrange("jobd:alerts")
    got = orjson.loads(alert[b"payload"])
    shown = jobd_cli("dlq", "-c", cfg, "a", "show", "d", "--json")
    assert shown.returncode == 0, shown.stderr
    assert got == {"queue": "a", **json.loads(shown.stdout)}
    # it fails here: the JSON names the batch "\xff" (four characters), someone else's
    assert "jobd_batch" not in got["fields"], got["fields"]
    assert b"jobd_batch" not in letter, letter
