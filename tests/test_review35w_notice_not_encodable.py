"""Review 35w of issue 35 (medium): one release notice in a queue's outbox whose waiter line
holds a JSON list or object where jobd writes text or a number (someone else's XADD: here
``"maxlen": [1]``) stops every move of that outbox for good, on one Redis as on a cluster: no
held job of the queue is released, no batch member's end is counted, no seal applied, and (on
a cluster) no follow-up of the queue's jobs moved.

What is wrong: store/workflows.py ``move_notices`` removes a notice it cannot read ("so that it
never holds back the notices behind it") only when building its call raises (KeyError,
TypeError, ValueError, JSONDecodeError). ``unblock_call`` copies the waiter's ``maxlen``,
``settings``, ``job``, ``hold`` into the script's arguments unchecked; redis-py refuses to
encode a list or a dict (DataError) when the round's pipeline is packed, in ``self.run(sent)``,
which raises for the whole round instead of giving one error among the replies. The error
leaves ``move_notices`` and ``_move_round``, so nothing read in the round is applied, no
cursor is left (``_outbox_resume``), and the next move starts from the outbox's first entry,
the same one: the daemon logs "outbox of queue a failed" every 2 s, and so does the settle's
move.

Reproduce: XADD into queue a's outbox {kind: release, dep: 'a d', outcome: done, event: done,
waiter: waiter_line(a, 'g') with maxlen [1]}; one daemon; `jobd enqueue a h --job-id h --after
d`, `jobd enqueue a x --job-id d`. d runs and is done; h is "held: waiting for 1 of 1: a d"
for ever, the release notice d's end wrote stays behind the garbage one.

What should happen: as for any notice that is not jobd's (review 35c), it is logged and
removed, and the notices behind it are applied: h runs. Why it matters: one foreign write in
one key silently stops all dependencies and batches of a queue (and its follow-ups on a
cluster), where docs/workflows.md promises a release and one callback "whatever the daemons
do". Suggested fix: in ``unblock_call`` (or ``_notice_call``) check each waiter value's type
(str for job, hold, stream, base, dead, settings; int or str for maxlen) and raise TypeError
for another, so that the notice is garbage; and/or make ``Batch.run`` turn an encoding error
of one call into that call's reply (encode each call's arguments before the pipeline).

Fixed (f35wb): both. A release notice's waiter line is read by store/outbox.py ``waiter_of``: no
JSON object, its base, stream, dead-letter stream or job no text, its MAXLEN no integer is a
TypeError, so the notice is no notice jobd wrote: logged and removed. Every notice's call is
then looked at whole (``call_misfit``): a key or argument redis-py cannot encode (the hook's,
the settings) or, on a cluster, keys in two slots makes it garbage too. And ``Batch.run`` sends
no call redis-py cannot encode: its reply is a DataError, the others are sent and answered,
where redis-py refused the whole pipeline. The last two tests show each; all three fail
without the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson
import redis
from support import DaemonProcess, jobd_cli, wait_until
from test_after_batches import RUNS, runs

from jobd.config import load
from jobd.store.scripts import Batch
from jobd.store.store import Store
from jobd.store.workflows import waiter_line

Daemon = Callable[..., DaemonProcess]


def test_a_notice_redis_py_cannot_encode_does_not_stop_the_outbox(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    cfg = write_config(
        f"redis: {{url: '{{redis}}'}}\nqueues:\n  a:\n    command: [{script('runs.sh', RUNS)}]\n"
    )
    c = str(cfg)
    q = load(c).queues["a"]
    waiter = {**orjson.loads(waiter_line(q, "g")), "maxlen": [1]}  # someone else's notice
    r.xadd(q.keys.outbox, {"kind": "release", "dep": "a d", "outcome": "done", "event": "done",
                           "waiter": orjson.dumps(waiter)})  # fmt: skip
    daemon(cfg)
    assert jobd_cli("enqueue", "-c", c, "a", "h", "--job-id", "h", "--after", "d").returncode == 0
    assert jobd_cli("enqueue", "-c", c, "a", "x", "--job-id", "d").returncode == 0
    wait_until(lambda: "d" in runs(tmp_path), 20, what="d run")
    wait_until(lambda: "h" in runs(tmp_path), 20, what="h released (d done) and run")
    wait_until(lambda: r.xlen(q.keys.outbox) == 0, 10, what="a's outbox emptied")


def test_notices_no_call_can_be_made_of_are_removed_and_the_one_behind_applied(
    r: redis.Redis, write_config
) -> None:
    """Release notices whose waiter line jobd never wrote, each in another way (its MAXLEN a
    list, true, text; its queue's stream a list: keys are derived from it; no JSON object; its
    history settings an object; its hook's stream a list), then a batch notice jobd wrote: one
    move removes each bad one, logged, applies the last, and raises nothing."""
    cfg = write_config("redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n")
    q = load(str(cfg)).queues["a"]
    line = orjson.loads(waiter_line(q, "g"))
    hook = {"queue": "a", "stream": [1], "delayed": "d", "head": "h"}
    for changed in ({"maxlen": [1]}, {"maxlen": True}, {"maxlen": "9"}, {"base": [1]},
                    {"settings": {}}, {"hook": hook}):  # fmt: skip
        waiter = orjson.dumps({**line, **changed})
        r.xadd(q.keys.outbox, {"kind": "release", "dep": "a d", "outcome": "done",
                               "event": "done", "waiter": waiter})  # fmt: skip
    r.xadd(q.keys.outbox, {"kind": "release", "dep": "a d", "outcome": "done", "waiter": "[1]"})
    r.hset("{jobd:batch:C}", mapping={"state": "sealed", "total": 1, "done": 0, "failed": 0,
                                      "open": 0, "ttl": 3600})  # fmt: skip
    r.xadd(q.keys.outbox, {"kind": "batch", "batch": "C", "member": "a c", "outcome": "done",
                           "event": "done"})  # fmt: skip
    assert Store(r).move_follow_ups(q) == 8
    assert r.xlen(q.keys.outbox) == 0
    assert r.hget("{jobd:batch:C}", "state") == b"complete"


def test_a_call_redis_py_cannot_encode_is_that_calls_error_alone(r: redis.Redis) -> None:
    """A batch of script calls, one of them with an argument redis-py refuses (a list): that
    call's reply is its DataError, sent to no one; the others are sent and answered."""
    store = Store(r)
    sent = Batch()
    r.hset("w", mapping={"x": "1"})
    for args in (["d", "j", "t"], ["d", [1], "t"], ["d", "j", "t"]):
        sent.add(store.scripts.unwait, ["w"], args)  # type: ignore[arg-type]
    first, bad, last = sent.run(r)
    assert (first, last) == (0, 0)
    assert isinstance(bad, redis.DataError)
