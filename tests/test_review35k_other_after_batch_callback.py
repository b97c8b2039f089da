"""Review of issue 35 (workflows), round 35k: `jobd enqueue --job-id x --after d2 --batch B
--on-complete cb` of a job held already `--after d1` exits 2 saying "nothing changed", yet it
made batch `B`, sealed it empty (complete, `total` 0) and enqueued its callback into `cb`.

What is wrong: review 35j made jobd.workflows.hold raise WorkflowError (exit 2) when the held
job waits for other jobs than the enqueue names. It raises at its very end, inside the
producer's `with workflows.member(...)`: the batch was opened by `member.grow(1)` before the
hold (batch.lua 'open' and 'add'), the hold answered 0 (held already: `member.added(0)` took
the job back off the total), and `Member.__exit__` then seals the batch with a count of 0
(the exception is a usage error, not Redis away): a batch of no member, sealed, is complete,
and its callback goes into the `--on-complete` queue with `{"total": 0, ...}`.

What should happen: as docs/workflows.md says of every other exit-2 refusal of an enqueue ("An
enqueue refused before it adds anything (exit 2 ...) leaves the batch as it was: it neither
opens it nor seals it (sealed empty, it would be complete and call back with `total` 0)"),
and as the error itself says ("nothing changed"): no batch `B`, no callback.

Why it matters: the callback of a batch is what a pipeline's aggregate step waits for; an
operator's mistyped `--after` (refused, exit 2, "nothing changed") fires an aggregate of an
empty batch, and a batch id used for the real run afterwards is complete already (its jobs
refused, exit 2: "a complete batch takes no more jobs")."""

from __future__ import annotations

import redis
from support import jobd_cli

from jobd.config import load

CONFIG = (
    "redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n"
    "  cb:\n    command: [/bin/true]\n"
)


def test_an_enqueue_refused_for_another_after_makes_no_batch(r: redis.Redis, write_config) -> None:
    c = str(write_config(CONFIG))
    cb = load(c).queues["cb"]
    out = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "x", "--after", "d1")
    assert out.returncode == 0, out.stderr
    out = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "x", "--after", "d2",
                   "--batch", "B", "--on-complete", "cb")  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert b"nothing changed" in out.stderr, out.stderr
    callbacks = r.xrange(cb.stream)
    shown = jobd_cli("batch", "-c", c, "B", "--json")
    assert not callbacks, (
        f"exit 2, 'nothing changed', yet batch B was made and called back: {callbacks}; "
        f"jobd batch B: {shown.stdout.strip()}"
    )
    assert shown.returncode == 3, f"batch B exists: {shown.stdout.strip()}"
