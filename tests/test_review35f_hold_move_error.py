"""Review of issue 35 (workflows), round 7 (review35f): review 35e made an outbox notice that
fails at every move (a batch hash whose count someone wrote as no number: lua/batch.lua leaves
it "to be moved again" by design) stay, "its error logged", without holding back the others
(store/outbox.py). Every move_follow_ups call still raises that notice's error once its rounds
are done, and jobd.workflows.hold calls it, unguarded, after holding a job whose dependency had
ended already (`jobd enqueue --after X`, X cancelled, dead-lettered or expired): the held job is
dead-lettered `dependency`, its batch counted and called back, all as designed, and the
enqueue then fails with a traceback (exit 1: "hash value is not an integer", about another
batch the user never named), so a script or an operator takes the enqueue as not done (with
--wait, the job's end is never said). cancel.py's move after a cancel logs the same error and
succeeds. No daemon: X is a delayed job cancelled."""

from __future__ import annotations

import redis
from support import jobd_cli

from jobd.config import load


def test_an_after_enqueue_succeeds_whatever_someone_elses_notice_in_the_outbox_does(
    r: redis.Redis, write_config
) -> None:
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n"
        "  cb:\n    command: [/bin/true]\n"
    )
    c = str(cfg)
    q = load(c).queues["a"]
    r.hset("{jobd:batch:B}", "done", "abc")  # someone's write: B's counts fail at every move
    r.xadd(q.keys.outbox, {"kind": "batch", "batch": "B", "member": "a m", "outcome": "done",
                           "event": "done"})  # fmt: skip
    assert jobd_cli("enqueue", "-c", c, "a", "x", "--job-id", "x", "--delay", "1h").returncode == 0
    assert jobd_cli("cancel", "-c", c, "a", "x").returncode == 0
    out = jobd_cli("enqueue", "-c", c, "a", "h", "--job-id", "h", "--after", "x",
                   "--batch", "H", "--on-complete", "cb")  # fmt: skip
    shown = jobd_cli("job", "-c", c, "a", "h").stdout.decode()
    assert "dependency a x cancelled" in shown  # held, and dead-lettered: all done
    assert jobd_cli("batch", "-c", c, "H").stdout.startswith(b"batch H: complete")
    assert (out.returncode, out.stdout) == (0, b"h\n"), out.stderr[-300:]
