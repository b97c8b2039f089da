"""Review of issue 35 (workflows), round 35o: a batch member that ends without a run (held with
``--after`` and cancelled, delayed and cancelled) has no ``batch`` in any of its records, so
``jobd job`` does not show ``batch: B`` (``--json``: ``"batch": null``), though the batch counts
its end (failed 1 of 1).

docs/workflows.md ("Dependencies", `jobd job`): "A member's records carry `batch`, and `jobd job`
shows `batch: ID`"; the issue: "`jobd job` shows a job's parent, follow-ups, dependencies and
batch". Only the ends told by an attempt's note (store/notes.py links: done, dead-lettered,
retried, expired) put ``batch`` in the record; the records written in Lua for a job that never
ran (hold.lua's ``waiting``, scheduled.lua's ``scheduled``, cancel_held.lua / cancel_delayed.lua
/ cancelled.lua / promote.lua ``cancelled``, dedupe.lua ``deduped``) carry none, and
store/records.py ``links`` finds the batch in the records only."""

from __future__ import annotations

import json

import redis
from support import jobd_cli

CONFIG = (
    "redis: {url: '{redis}'}\nqueues:\n"
    "  a:\n    command: [/bin/true]\n"
    "  cb:\n    command: [/bin/true]\n"
)


def test_a_member_ended_unrun_is_shown_in_its_batch(r: redis.Redis, write_config) -> None:
    c = str(write_config(CONFIG))
    for job, extra in (("held", ("--after", "never")), ("late", ("--delay", "1h"))):
        out = jobd_cli("enqueue", "-c", c, "a", "x", "--job-id", job, *extra, "--batch", "B",
                       "--on-complete", "cb")  # fmt: skip
        assert out.returncode == 0, out.stderr
    out = jobd_cli("cancel", "-c", c, "a", "held", "late")
    assert out.returncode == 0, out.stderr
    state = json.loads(jobd_cli("batch", "-c", c, "B", "--json").stdout)
    assert (state["total"], state["failed"]) == (2, 2), state  # the batch counts both ends
    shown = {}
    for job in ("held", "late"):
        got = json.loads(jobd_cli("job", "-c", c, "a", job, "--json").stdout)
        text = jobd_cli("job", "-c", c, "a", job).stdout.decode()
        shown[job] = (got["batch"], "batch: B" in text, [x["event"] for x in got["records"]])
    assert shown == {
        "held": ("B", True, ["waiting", "cancelled"]),
        "late": ("B", True, ["scheduled", "cancelled"]),
    }, f"jobd job of the batch's members (batch, 'batch: B' shown, records): {shown}"
