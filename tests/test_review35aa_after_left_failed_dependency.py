"""low: `jobd job --json` of a held job dead-lettered `dependency` lists the dependency whose
failure dead-lettered it in `after.left`, "those not yet ended": the one job it names as ended
(its `detail`: "dependency f f1 dead-lettered") is reported not ended, and with a `lost`
dependency every job it waited for is.

What is wrong: docs/workflows.md, "Seeing dependencies and batches": `jobd job --json` has
"`after` (`{all, left, any}`: every job it waits or waited for, those not yet ended …)", and
its records are "`waiting` …, `dependency` per job that ended (`dependency`, `outcome`,
`left`), then `released` or `dead-lettered`". store/records.py ``links`` strikes a job off
`left` only on a `dependency` record, but unblock.lua, for a dependency that did not end done
(no --after-any-outcome), writes no `dependency` record: it goes straight to `held_dead`,
whose `dead-lettered` record holds only `error` and `detail` (its event has `dependency`, the
record not). So `left` keeps the failed dependency for ever; `/api/job` (the dashboard's links)
says the same.

Reproduce: a daemon; `jobd enqueue b p --job-id w --after f:f1 --after f:f2` (f2 never sent),
then `jobd enqueue f x --job-id f1` whose handler exits 65 (exit_codes.fail). w is
dead-lettered `dependency f f1 dead-lettered`; `jobd job --json b w` says
"left": ["f f1", "f f2"].

What should happen: "left": ["f f2"] (f1 ended; f2 never did), as a `dependency` record would
give. Why it matters: a script (or the dashboard) that reads `left` to tell what a dead-lettered
job still waits on, or which dependency failed, reads the one that failed as still pending.

Suggested fix: unblock.lua writes the failed dependency into the `dead-lettered` record
(`dependency = dep`, as its event has), and ``links`` strikes it off `left` for a
`dead-lettered` record that names one (or write the `dependency` record before `held_dead`,
as the done path does, which also makes the records match the page).

Fixed (review 35aa): unblock.lua writes the dependency whose end dead-lettered the held job, and
how it ended, into its `dead-lettered` record (`dependency`, `outcome`: lib/workflows.lua
held_dead), as its event names it, and store/records.py ``links`` strikes a `dead-lettered`
record's dependency off `left`, as it does a `dependency` record's.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import redis
from support import DaemonProcess, jobd_cli, wait_until

CONFIG = """\
redis: {url: '{redis}'}
queues:
  f:
    command: [/bin/sh, -c, 'cat >/dev/null; exit 65']
    exit_codes: {fail: [65]}
  b:
    command: [/bin/true]
"""


def test_a_failed_dependency_is_not_left(
    r: redis.Redis, write_config, daemon: Callable[..., DaemonProcess]
) -> None:
    path = write_config(CONFIG)
    daemon(path)
    cfg = str(path)
    out = jobd_cli("enqueue", "-c", cfg, "b", "p", "--job-id", "w", "--after", "f:f1",
                   "--after", "f:f2")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert jobd_cli("enqueue", "-c", cfg, "f", "x", "--job-id", "f1").returncode == 0

    def shown() -> dict:
        got = jobd_cli("job", "--json", "-c", cfg, "b", "w")
        assert got.returncode == 0, got.stderr
        return json.loads(got.stdout)

    wait_until(lambda: shown()["state"] == "dead-lettered", what="w dead-lettered")
    got = shown()
    assert got["records"][-1]["detail"] == "dependency f f1 dead-lettered"
    assert (got["records"][-1]["dependency"], got["records"][-1]["outcome"]) == (
        "f f1", "dead-lettered")  # fmt: skip
    assert got["after"]["all"] == ["f f1", "f f2"]
    assert got["after"]["left"] == ["f f2"], got["after"]
