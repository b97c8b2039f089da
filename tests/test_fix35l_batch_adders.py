"""Fix of review 35l (batch refusals), batch.lua's side: an adder that counted no job into a
batch (its enqueue added nothing) neither completes it nor calls it back. Its seal takes it off;
when no adder is left and none counted a job, the batch is gone, as if never made, and a copy of
that seal (a lost reply, its notice moved again) changes nothing; beside another adder, at the
same time, the batch is that adder's alone."""

from __future__ import annotations

import redis

from jobd.store.keys import batch, batch_adders
from jobd.store.store import Store

OPEN = (60, "", b"")


def test_an_adder_of_nothing_alone_leaves_no_batch(r: redis.Redis) -> None:
    s = Store(r)
    s.batch_op("B", "open", "t1", *OPEN)
    s.batch_op("B", "add", "t1", 1, 1)  # one job counted before it is sent
    s.batch_op("B", "add", "t1", 2, 0)  # not added (a duplicate, a refusal)
    assert s.batch_op("B", "seal", "t1", 3, 0) is None
    assert not r.exists(batch("B"), batch_adders("B"))
    assert s.batch_op("B", "seal", "t1", 3, 0) is None  # sent again: still none
    assert not r.exists(batch("B"), batch_adders("B"))
    state = s.batch_op("B", "open", "t2", *OPEN)  # later, a batch made anew, one to add to
    assert state is not None and state.state == "open"


def test_two_adders_at_once_one_of_nothing(r: redis.Redis) -> None:
    s = Store(r)
    s.batch_op("B", "open", "zero", *OPEN)
    s.batch_op("B", "open", "five", *OPEN)
    s.batch_op("B", "add", "five", 1, 5)
    s.batch_op("B", "add", "zero", 1, 1)
    state = s.batch_op("B", "seal", "zero", 2, 0)  # added nothing: sealed first
    assert state is not None and (state.state, state.total) == ("open", 5)
    for n in range(5):
        s.batch_op("B", "count", f"outbox 1-{n}", "done")
    state = s.batch_op("B", "seal", "zero", 2, 0)  # its copy: nothing more
    assert state is not None and state.state == "open", "not complete before five seals"
    state = s.batch_op("B", "seal", "five", 2, 5)
    assert state is not None and (state.state, state.total, state.done) == ("complete", 5, 5)


def test_the_one_of_nothing_sealing_last_completes_the_other(r: redis.Redis) -> None:
    s = Store(r)
    s.batch_op("B", "open", "zero", *OPEN)
    s.batch_op("B", "open", "two", *OPEN)
    s.batch_op("B", "add", "two", 1, 2)
    state = s.batch_op("B", "seal", "two", 2, 2)
    assert state is not None and state.state == "open"  # zero still at work
    s.batch_op("B", "count", "outbox 1-0", "done")
    s.batch_op("B", "count", "outbox 1-1", "failed")
    state = s.batch_op("B", "seal", "zero", 1, 0)
    assert state is not None and (state.state, state.total, state.failed) == ("complete", 2, 1)


def test_a_batch_sealed_with_nothing_before_a_late_open_is_not_complete(r: redis.Redis) -> None:
    """zero opens and seals with nothing (gone); five opens after: a batch of its own, and a
    copy of zero's seal moved late takes nothing from it."""
    s = Store(r)
    s.batch_op("B", "open", "zero", *OPEN)
    assert s.batch_op("B", "seal", "zero", 1, 0) is None
    s.batch_op("B", "open", "five", *OPEN)
    state = s.batch_op("B", "seal", "zero", 1, 0)  # the late copy
    assert state is not None and (state.state, state.total) == ("open", 0)
    s.batch_op("B", "add", "five", 1, 5)
    state = s.batch_op("B", "seal", "five", 2, 5)
    assert state is not None and (state.state, state.total) == ("sealed", 5)
