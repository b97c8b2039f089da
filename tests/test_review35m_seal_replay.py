"""Review 35m: a seal that counted 0 deletes the batch and returns {}; batch.lua says "a copy
of this seal finds none ({}), as this one says". When another enqueue re-made the batch of the
same id between the seal and its copy (the seal's notice moved twice: store/workflows.py), the
copy is taken as "a seal of an open never applied": it writes ``TOKEN -> sealed 0`` into the
NEW batch's adders and answers with the new batch's state, not {} as the first answer did.
The two answers to one call differ, and the new batch holds an adder that never opened it.
Fix idea: the seal's notice names the batch's incarnation (the open's reply), and a seal whose
incarnation is not the batch's finds none ({}) and writes nothing.

Fixed: the seal's notice carries the incarnation its open answered (jobd/workflows.py Member);
batch.lua's seal of another incarnation answers {} and writes nothing. A seal without one (a
notice a jobd before wrote) is applied as before."""

from __future__ import annotations

import redis

from jobd.store import keys as k
from jobd.store.scripts import source


def call(r: redis.Redis, bid: str, *args: object) -> list:
    ks = [k.batch(bid), k.batch_members(bid), k.batch_adders(bid)]
    return r.eval(source("batch"), 3, *ks, *args)


def test_a_replayed_empty_seal_after_the_batch_was_remade_finds_none(r: redis.Redis) -> None:
    bid = "b35m"
    inc = call(r, bid, "open", "tokA", 3600, "", "")[6]
    assert call(r, bid, "seal", "tokA", 1, 0, inc) == []  # counted 0: the batch is gone
    assert not r.exists(k.batch(bid))
    call(r, bid, "open", "tokB", 3600, "", "")  # another enqueue makes it again
    call(r, bid, "add", "tokB", 1, 1)
    again = call(r, bid, "seal", "tokA", 1, 0, inc)  # A's seal notice moved a second time
    assert r.hget(k.batch_adders(bid), "tokA") is None, "a stale seal wrote into the new batch"
    assert again == [], f"the copy answered {again!r}, the first answer was []"


def test_a_seal_of_the_batch_it_opened_applies_and_its_copy_changes_nothing(
    r: redis.Redis,
) -> None:
    bid = "b35m2"
    inc = call(r, bid, "open", "tokA", 3600, "", "")[6]
    call(r, bid, "add", "tokA", 1, 2)
    first = call(r, bid, "seal", "tokA", 2, 2, inc)
    assert first[0] == b"sealed" and first[1] == b"2"
    assert call(r, bid, "seal", "tokA", 2, 2, inc) == first
    assert r.hget(k.batch_adders(bid), "tokA") == b"sealed 2"
