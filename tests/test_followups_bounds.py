"""What bounds the one Redis call that writes a job's follow-ups with its acknowledgement
(fixer f35wa, review 35w): ``max_follow_ups_bytes`` (what a JOBD_ENQUEUE file's jobs hold
together, each field counted as 128 bytes at least), and a settle.lua call of its own for a job
whose follow-ups would take the call past that weight (fixer f35y; many fields before), and
an outbox move's calls cut by it. Real Redis; the parse is the daemon's
(``process.followups.parse``). The reproductions of review 35w are in test_review35w_*.py."""

from __future__ import annotations

import orjson
import pytest
import redis
from support import jobd_cli

from jobd.config import load
from jobd.job import Job
from jobd.outcome import Outcome, Verb, weight
from jobd.process import followups
from jobd.store import scripts
from jobd.store.outbox import cut, packed_weight
from jobd.store.store import Store


def queues(write_config, parent: str = "") -> object:
    return load(str(write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  a: {{command: [/bin/true]{parent}}}\n  b: {{command: [/bin/true]}}\n"
    ))).queues  # fmt: skip


def read_one(r: redis.Redis, job_id: str) -> Job:
    """A job of queue a, read by consumer "me" (the entry pending: an ack can settle it)."""
    r.xgroup_create("jobd:a", "jobd", id="0", mkstream=True) if not r.exists("jobd:a") else None
    r.xadd("jobd:a", {"payload": "x", "job_id": job_id})
    (mid, fields), *_ = r.xreadgroup("jobd", "me", {"jobd:a": ">"}, count=1)[0][1]
    return Job.from_entry("a", mid, fields)


def test_a_file_heavier_than_max_follow_ups_bytes_is_refused_naming_its_line(
    r: redis.Redis, write_config
) -> None:
    qs = queues(write_config, ", max_follow_ups_bytes: 2KiB")
    job = read_one(r, "p")
    short = b'{"queue": "b", "payload": "x"}\n'  # payload, job_id, jobd_parent: 3 x 128 bytes
    assert [followups.weight(f.fields) for f in followups.parse(short, job, qs["a"], qs)] == [384]
    assert len(followups.parse(short * 5, job, qs["a"], qs)) == 5  # 1 920 bytes: taken
    with pytest.raises(followups.FollowUpError) as refused:
        followups.parse(short * 6, job, qs["a"], qs)  # 2 304 bytes
    assert str(refused.value) == (
        "JOBD_ENQUEUE: its jobs up to line 6 hold more than max_follow_ups_bytes (2048), each "
        "field counted as 128 bytes at least"
    )
    big = orjson.dumps({"queue": "b", "payload": "y" * 1700}) + b"\n"  # bytes count as bytes
    assert len(followups.parse(big, job, qs["a"], qs)) == 1
    with pytest.raises(followups.FollowUpError, match="up to line 2 hold more"):
        followups.parse(short + big, job, qs["a"], qs)


@pytest.mark.parametrize("size", ["1023", "65MiB"])
def test_max_follow_ups_bytes_is_from_1kib_to_64mib(write_config, size: str) -> None:
    path = write_config(
        f"redis: {{url: '{{redis}}'}}\nqueues:\n  a: {{command: [/bin/true], "
        f"max_follow_ups_bytes: {size}}}\n"
    )
    out = jobd_cli("validate", str(path))
    assert out.returncode != 0
    assert b"max_follow_ups_bytes: give from 1KiB to 64MiB" in out.stdout + out.stderr


def test_jobs_with_many_follow_up_fields_are_settled_in_calls_of_their_own(
    r: redis.Redis, write_config
) -> None:
    """Two parents whose files hold 2 991 fields each (374 KiB by ``outcome.weight``: 128
    bytes a field), and two whose one follow-up is small, settled together on a queue of
    max_follow_ups_bytes 512 KiB: two settle.lua calls, each one file's (and a small one's),
    not one call as long as both files."""
    qs = queues(write_config, ", max_follow_ups_bytes: 512KiB")
    line = orjson.dumps({"queue": "b", "payload": "", "fields": {f"f{i}": "" for i in range(994)}})
    wide = (line + b"\n") * 3
    small = b'{"queue": "b", "payload": "x"}\n'
    outcomes = []
    for job_id, data in (("w1", wide), ("s1", small), ("w2", wide), ("s2", small)):
        job = read_one(r, job_id)
        found = followups.parse(data, job, qs["a"], qs)
        outcomes.append(Outcome(Verb.ACK, qs["a"], job, follow_ups=found))
    r.script_load(scripts.source("settle"))  # no NOSCRIPT try in the log
    r.config_set("slowlog-log-slower-than", 0)
    r.slowlog_reset()
    Store(r, "me").settle(outcomes)
    settle = f"EVALSHA {scripts.sha('settle')} ".encode()
    settles = [e["command"] for e in r.slowlog_get(100) if e["command"].startswith(settle)]
    assert len(settles) == 2, [c[:120] for c in settles]
    assert r.xpending("jobd:a", "jobd")["pending"] == 0
    assert r.xlen("jobd:b") == 8


@pytest.mark.parametrize("width", [1, 7, 8, 990])  # a fixarray, then an array 16
def test_an_outbox_entry_weighs_what_its_follow_up_does_or_a_little_more(
    r: redis.Redis, width: int
) -> None:
    """``packed_weight`` reads the count of an outbox entry's fields from the header of what
    cmsgpack packed (as settle.lua packs them), unpacking nothing: at least the follow-up's
    ``outcome.weight``, at most 128 bytes a field and the packing's own bytes more."""
    fields = {b"payload": b"y" * 300} | {b"f%d" % i: b"" for i in range(width - 1)}
    flat = [x for pair in fields.items() for x in pair]
    packed = r.eval("return cmsgpack.pack(ARGV)", 0, *flat)
    assert weight(fields) <= packed_weight(packed) <= weight(fields) + 128 * width + len(packed)
    assert packed_weight(packed) - len(packed) == 128 * width  # the header's count, exactly
    entries = [(b"%d-0" % n, {b"fields": packed}) for n in range(5)]
    one = packed_weight(packed)
    assert [len(c) for c in cut(entries, 2 * one, 100)] == [2, 2, 1]
    assert [len(c) for c in cut(entries, one - 1, 100)] == [1] * 5  # each alone, none left
    assert [len(c) for c in cut(entries, 10 * one, 3)] == [3, 2]  # at most max_follow_ups
