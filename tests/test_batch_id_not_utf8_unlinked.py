"""Review 35s: `jobd job` reads, and reports on, a batch its record does not name.

A member's step records name its batch (lib/jobs.lua ``linked``, review 35q: reclaimed, lease
lost, requeue, promoted). ``linked`` keeps any jobd_batch of 1 to 800 bytes, UTF-8 or not
(someone's XADD: jobd never writes a batch id that is not UTF-8, workflow_input.check_batch_id
refuses one). The record's reader (store/records.py json_object) shows the byte 0xff as the
four characters ``\\xff``: then cli/workflow.py batch_now checks that text as a batch id and
reads the batch literally named ``\\xff`` (a legal id, someone else's), and batch_where tells
the user the record was a member of "an earlier batch of this id" (or points them at
`jobd batch \\xff`): a batch the job never was a member of.

Fixed: a jobd_batch that is not a batch id (not UTF-8, or not what check_batch_id takes) is no
batch link, in Lua and Python alike (jobd.job.is_batch_id); `jobd job` reads none for it.
"""

from __future__ import annotations

import redis
from support import jobd_cli

from jobd.config import load
from jobd.store.store import Store

CONFIG = (
    "redis: {url: '{redis}'}\nqueues:\n"
    "  a:\n    command: [/bin/true]\n"
    "  cb:\n    command: [/bin/true]\n"
)


def test_a_record_naming_a_batch_not_utf8_is_not_related_to_another(
    r: redis.Redis, write_config
) -> None:
    c = str(write_config(CONFIG))
    # someone else's batch, legally named with the four characters \xff
    out = jobd_cli("enqueue", "-c", c, "a", "x", "--job-id", "theirs",
                   "--batch", "\\xff", "--on-complete", "cb")  # fmt: skip
    assert out.returncode == 0, out.stderr
    q = load(c).queues["a"]
    dead = r.xadd(q.dead_letter.stream, {"payload": "x", "jobd_job_id": "rq",
                                         "jobd_error": "exit", "jobd_batch": b"\xff",
                                         "jobd_batch_incarnation": "5"})  # fmt: skip
    assert Store(r).requeue(q, [dead.decode()], "me@here").moved == [dead.decode()]
    shown = jobd_cli("job", "-c", c, "a", "rq")
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout.decode("utf-8", "replace")
    # the batch `\xff` (4 characters) is not the one its record names (the byte 0xff): no batch
    # id, so its record links none (lib/jobs.lua linked, store/notes.py _batch: the same rule)
    assert "earlier batch of this id" not in text, text
    assert "(jobd batch \\xff)" not in text, text
    assert not [line for line in text.splitlines() if "batch" in line], text
    assert b"batch" not in (r.hget(q.keys.history, "rq") or b""), "its records link a batch"


IDS = [b"B", b"\xff", b"a b", b"a{b", b"}", b"\x7f", b"\x1f", b"caf\xc3\xa9", b"\xc3", b"\xc0\xaf",
       b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xf0\x9f\x98\x80", b"\xc2\x85", b"\xc2\xa0",
       b"\xc2\x86", b"\xe2\x80\x80", b"\xe2\x80\x8a", b"\xe2\x80\x8b", b"\xe3\x80\x80", b"x" * 200,
       b"x" * 201, "é".encode() * 200, "é".encode() * 201, b"\xe1\x9a\x80", b""]  # fmt: skip


def test_lua_and_python_take_the_same_batch_ids(r: redis.Redis) -> None:
    """lib/jobs.lua batch_id_ok and jobd.job.is_batch_id: one rule, a record's batch link."""
    from pathlib import Path

    import jobd.store
    from jobd.job import is_batch_id

    lua = (Path(jobd.store.__file__).parent / "lua/lib/jobs.lua").read_text()
    start = lua.index("local SPACES")
    body = lua[start : lua.index("\nend\n", lua.index("local function batch_id_ok")) + 5]
    script = (
        body
        + "local out = {} for i, s in ipairs(ARGV) do out[i] = batch_id_ok(s) and 1 or 0 end return out"
    )
    got = r.eval(script, 0, *IDS)
    assert dict(zip(IDS, got, strict=True)) == {i: int(is_batch_id(i)) for i in IDS}


def test_an_attempts_note_links_no_batch_that_is_not_a_batch_id(
    r: redis.Redis, write_config, daemon
) -> None:
    """The note of an attempt (store/notes.py _batch) drops it as ``linked`` does."""
    from support import wait_until

    cfg = write_config(CONFIG)
    daemon(cfg)
    q = load(str(cfg)).queues["a"]
    for job, batch in (("bad", b"\xff"), ("spaced", b"a b"), ("good", b"G")):
        r.xadd(q.stream, {"payload": "x", "job_id": job, "jobd_batch": batch})
    wait_until(lambda: r.hlen(q.keys.history) == 3, what="three jobs done")
    assert b'"batch":"G"' in (r.hget(q.keys.history, "good") or b"")
    for job in ("bad", "spaced"):
        assert b"batch" not in (r.hget(q.keys.history, job) or b""), job
