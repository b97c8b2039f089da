"""medium: an outbox entry whose ``fields`` unpack to an array with a nil inside (someone
else's XADD on a cluster: the msgpack array ["payload", nil, "x", "y"]) passes follow_up.lua's
check, then makes the whole follow_up.lua call of its group fail at every move: the follow-ups
jobd wrote into the same stream behind it, in the same group, are never added.

What is wrong. Review 35w's fix (f35wb) looks at each outbox entry alone before it joins its
group's call, so that no entry can fail the call of the entries grouped with it; follow_up.lua
``unpacked`` skips, for the caller to remove, fields that are not 1 to MAX_FIELDS name, value
pairs of text. It checks the values with ``ipairs``, which stops at the first nil, and the
count with ``#``, which for a table cmsgpack made of an array of n values with a nil inside is
n (its array part is full size, its last slot set): ["payload", nil, "x", "y"] is 4 values,
even, and ``ipairs`` sees "payload" only, so the entry is taken as a follow-up. ``add_job``
then copies the fields with ``ipairs`` as well (one value) and ``XADD stream * payload``
fails ("Wrong number of args calling Redis command from script"): the script errors after adding the entries before it in
its group, and those after it are never reached. The move raises at every call (the settle's
own and every tick of the outbox duty), the entry is never removed, and every follow-up into
that stream grouped with it waits for good, as before the fix for a mark in another slot.

Reproduce (three-master cluster, as tests/test_review35w_outbox_crossslot.py): XADD into p's
outbox an entry {stream, delayed: t's, mark: a mark of t, due: '', fields: the bytes
94 a7 'payload' c0 a1 'x' a1 'y'}, then a follow-up jobd wrote into t (another mark); call
``Store.move_follow_ups(p)``: ResponseError ("Wrong number of args calling Redis command from
script"), again on the second call, and t stays empty. With the suggested fix below (tried, not
committed) the test passes.

What should happen: such an entry is no follow-up jobd wrote (settle.lua packs only strings):
it is logged and removed alone, and the good one is added in the same move, as for the other
kinds of entry review 35w listed. Why it matters: docs/workflows.md promises a done job's
follow-ups are added; one foreign write stops a whole pipeline stage on a cluster.

Suggested fix: in follow_up.lua ``unpacked``, check the values by index, ``for i = 1, #fields
do local v = fields[i] ... end`` (nil is neither string nor number), as lib/jobs.lua
``decode_member`` does for delayed members; or compare #fields with a count of ``pairs``.

Fixed (fixer f35y): follow_up.lua ``unpacked`` checks the values by index, 1 to ``#fields``
(as lib/jobs.lua ``decode_member`` does): a nil is neither text nor a number, so the entry is
skipped, logged and removed alone, and the good one is added in the same move.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from redis.cluster import RedisCluster
from redis.exceptions import ResponseError
from support import LocalCluster

from jobd.config import load
from jobd.store.store import Store


def packed(values: list[bytes | None]) -> bytes:
    """msgpack's array of ``values`` (strings under 32 bytes, or nil), as cmsgpack reads it."""
    body = b"".join(b"\xc0" if v is None else bytes([0xA0 + len(v)]) + v for v in values)
    return bytes([0x90 + len(values)]) + body


def test_an_entry_with_a_nil_among_its_fields_holds_back_its_group(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(
        f"redis:\n  cluster:\n    nodes: [{cluster.nodes[0]}]\n"
        "queues:\n  p:\n    command: [/bin/true]\n    stream: 'rv35y:p'\n"
        "  t:\n    command: [/bin/true]\n    stream: 'rv35y:t'\n"
    )
    config = load(str(cfg))
    p, t = config.queues["p"], config.queues["t"]
    client = RedisCluster.from_url(f"redis://{cluster.nodes[0]}")
    try:
        good = {"queue": "t", "stream": t.stream, "delayed": t.keys.delayed, "due": "",
                "member": "m", "job": "g", "fields": packed([b"payload", b"x"])}  # fmt: skip
        holed = {**good, "mark": t.keys.follow_up("p", "h", "o", 1),
                 "fields": packed([b"payload", None, b"x", b"y"])}  # fmt: skip
        client.xadd(p.keys.outbox, holed)
        client.xadd(p.keys.outbox, {**good, "mark": t.keys.follow_up("p", "g", "o", 1)})
        store = Store(client)
        for _ in range(2):  # the settle's move, then the duty's: each fails the same way
            try:
                store.move_follow_ups(p)
            except ResponseError as exc:
                pytest.fail(f"the move failed on the entry with a nil field: {exc}")
        assert client.xlen(p.keys.outbox) == 0
        assert [f for _, f in client.xrange(t.stream)] == [{b"payload": b"x"}]
    finally:
        client.close()
