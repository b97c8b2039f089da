"""Review 35u of issue 35: the ``on_dead_letter`` job's JSON of a job read as a stand-in (an
entry over ``max_payload`` + 1 MiB, or of more than MAX_FIELDS fields: lib/jobs.lua ``sized``)
is not its dead-letter record, and since 8855d5b it names a batch the record does not keep.

docs/workflows.md: the hook's payload is "the dead-letter record as JSON: what `jobd dlq show
--json` prints of it, plus queue". dead_letter.lua writes the record from the entry itself
(XRANGE: its payload clipped to 1 KiB with ``jobd_clipped``; or, wider than MAX_FIELDS, its
first payload and job_id with ``jobd_fields``), while store/chains.py ``json_pieces`` builds
the JSON from ``o.job.fields``, which for a stand-in are the stand-in's own (``job_id``,
``jobd_unique``, ``jobd_parent``, ``jobd_batch``, ``jobd_batch_incarnation``; no payload).
So the alert of an oversize job has no payload and no ``jobd_clipped``; the alert of a wide
one names its ``jobd_batch`` (kept by 8855d5b's/1595423's KEPT) and ``jobd_unique``, which its
record, ``jobd dlq show --json`` and a requeue never name, and lacks the payload and
``jobd_fields`` they have.

Reproduce: a queue with ``on_dead_letter: {queue: alerts}``; someone XADDs (1) an entry with a
payload of max_payload + 1 MiB + 1 byte, (2) an entry of 1001 fields with ``jobd_batch`` R; a
daemon dead-letters both as malformed; compare each alert's JSON with `jobd dlq show --json`.

What should happen: each alert's JSON equals the shown record plus ``queue`` (as for every
other dead letter, tests/test_chains.py).

Suggested fix: for a stand-in (``jobd_oversize``/``jobd_overwide`` in ``o.job.fields``) have
dead_letter.lua build the JSON from the record it writes (as lib/chains.lua ``held_json``
does for a held job), or have json_pieces mirror dead_letter.lua's copy (the clipped payload
and ``jobd_clipped``; the wide record's first payload and job_id and ``jobd_fields``).

A fix (aeced24: the stand-in's JSON built in dead_letter.lua from the record, by lib/chains.lua
held_json) was reverted: it converted every byte of up to 1000 values to JSON in Lua, one at a
time, and searched for the cut up to 14 times, so one hostile stand-in held Redis 6-7 s
(tests/test_review35v_stand_in_json_blocks_redis.py). A fix needs a conversion in C-speed passes
(string.gsub over runs of bytes) and the cut's size worked out, not rebuilt. A second try did
both (utf8_text in string.find/gsub passes, each cut's JSON size counted, the JSON built once):
72-92 ms for review 35v's 0xff entry, but 130-430 ms a call for values of mixed valid and
invalid UTF-8 ("é\x01" the worst found), against 25 ms before: not merged. What is left: a
conversion with per-value counts computed once (no pass per cut), or a bound on what of a
stand-in's record goes into its JSON.

Fixed (review 35u, third try): the JSON stays built in Python; for a record that clips (a
malformed job's, every stand-in's) the daemon first reads, by record_copy.lua, the entry's copy
as dead_letter.lua writes it (one code: lua/lib/record.lua), bounded to MAX_FIELDS values of
1 KiB, and builds the JSON from it (store/chains.py json_pieces). The copy of review 35v's
hostile entry costs Redis 8-10 ms; no Lua converts anything. A job refused for its payload's
size but read whole (the third case) had the same fault: its JSON kept the payload whole (cut
at 4 KiB), its record 1 KiB of it and jobd_clipped. An entry deleted before the copy is read
gives a JSON without its fields, as its record (the last test)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
import redis
from support import DaemonProcess, jobd_cli, wait_until

from jobd.config import load
from jobd.job import Job
from jobd.outcome import MALFORMED, Outcome, Verb
from jobd.store.store import Store

Daemon = Callable[..., DaemonProcess]

CONFIG = """\
redis: {url: '{redis}'}
queues:
  a:
    command: [/bin/false]
    max_payload: 4KiB
    retry: {max_attempts: 1}
    on_dead_letter: {queue: alerts}
  alerts:
    command: [/bin/true]
"""  # alerts' settings last: a test may add its own (test_review35v_stand_in_json_blocks_redis)


def alert_and_record(r: redis.Redis, cfg: str, job_id: str) -> tuple[dict, dict]:
    alerts = [orjson.loads(f[b"payload"]) for _, f in r.xrange("jobd:alerts")]
    (got,) = [a for a in alerts if a["job_id"] == job_id]
    shown = jobd_cli("dlq", "-c", cfg, "a", "show", job_id, "--json")
    assert shown.returncode == 0, shown.stderr
    return got, {"queue": "a", **json.loads(shown.stdout)}


@pytest.mark.parametrize("kind", ["oversize", "overwide", "clipped"])
def test_a_stand_ins_alert_is_its_dead_letter_as_json(
    r: redis.Redis, write_config, daemon: Daemon, tmp_path: Path, kind: str
) -> None:
    path = write_config(CONFIG)
    if kind == "oversize":
        r.xadd("jobd:a", {"payload": b"x" * (4096 + (1 << 20) + 1), "job_id": "big"})
        job_id = "big"
    elif kind == "clipped":  # over max_payload, not a stand-in: read whole, its record clips
        r.xadd("jobd:a", {"payload": b"y" * 5000, "job_id": "long", "jobd_unique": "u"})
        job_id = "long"
    else:
        fields = {"payload": "p", "job_id": "wide", "jobd_batch": "R"}
        fields.update({f"f{i:04}": "v" for i in range(1001)})
        r.xadd("jobd:a", fields)
        job_id = "wide"
    daemon(path)
    wait_until(lambda: r.xlen("jobd:alerts") == 1, what="the alert")
    got, record = alert_and_record(r, str(path), job_id)
    assert got == record, (sorted(got["fields"]), sorted(record["fields"]))


def test_a_stand_in_whose_entry_is_gone_alerts_with_none_of_its_fields(
    r: redis.Redis, write_config
) -> None:
    """Its entry deleted by hand (XDEL) while it is pending: its record keeps none of its
    fields, and neither does its alert (record_copy.lua finds no entry)."""
    path = write_config(CONFIG)
    cfg = load(str(path))
    r.xgroup_create("jobd:a", "jobd", id="0", mkstream=True)
    mid = r.xadd("jobd:a", {"payload": b"x" * (4096 + (1 << 20) + 1), "job_id": "big"})
    r.xreadgroup("jobd", "me", {"jobd:a": ">"})
    r.xdel("jobd:a", mid)
    job = Job.from_entry("a", mid, {b"jobd_oversize": b"1053714", b"job_id": b"big"})
    assert job.malformed
    Store(r, "me").settle([Outcome(Verb.DEAD_LETTER, cfg.queues["a"], job, MALFORMED, attempts=1)])
    got, record = alert_and_record(r, str(path), "big")
    assert got == record
    assert not any(not name.startswith("jobd_") for name in got["fields"]), got["fields"]
