"""medium: a taken record written by wait_on.lua is never swept: {S}:taken grows by one record
for every job ever waited for while it ran, and keeps them after the jobs ended.

What is wrong. wait_on.lua records a running job in the queue's taken hash (HSETNX) when a
waiter (`jobd enqueue --after`) registers while the job runs, but it never sweeps
(lib/workflows.lua sweep_taken), and no settle script removes a record: only lost_end removes
one, and take_note's sweep, which runs only when a read takes a *workflow* job (a batch's, or
one that had waiters when it was read). A queue whose jobs are read before anything waits for
them (the usual pipeline: enqueue X; once X runs, enqueue Y --after X) has no such read: every
X leaves its record behind for ever. store/keys.py promises "a record whose entry is pending no
more is swept by later writes", docs/design/diary.md "the hash stays near twice the workflow
jobs running", lib/workflows.lua "never the ones that ran".

Reproduce (real daemon, real Redis): ten jobs read with no waiter, each waited for once it has
run half a second (its running record), then all let end, then thirty plain jobs more: the
taken hash still holds the ten records of jobs that ended (pending: 0).

What should happen: once nothing is pending, the taken hash is (near) empty; its size stays
bounded by the workflow jobs running, whatever the number of jobs that ran.

Why it matters: an unbounded key on the producer's hot path (one record, ~60 bytes plus the
job id, per job waited for), in every queue used with --after; nothing ever removes it, not
even history.max_age.

Suggested fix: wait_on.lua calls sweep_taken after its HSETNX (it has the group: ARGV[3]), as
take_note does, so that each write sweeps two records; or settle.lua (ack, cancel) and
dead_letter.lua HDEL their entry's record when the queue's waiters hash says the job was waited
for (a field they compute already for ``ended``).

Fixed (task f35xb): the step that ends a workflow job while it is pending (settle.lua for done
and cancelled, dead_letter.lua, and settle.lua's hand-back that finds the entry deleted)
removes its entry's taken record (lib/workflows.lua ``untake``: only when the queue has
waiters or the job is a batch's, so a job of no workflow pays nothing), and wait_on.lua sweeps
as the reads' writes do (``sweep_taken``). Without ``untake`` the ten records stay."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli, wait_until

Daemon = Callable[..., DaemonProcess]

HANDLER = """\
#!/bin/sh
cat >/dev/null
case "$JOBD_JOB_ID" in
  x*) while [ ! -e "$(dirname "$0")/go" ]; do sleep 0.05; done;;
esac
exit 0
"""


def test_records_wait_on_writes_for_running_jobs_are_swept_once_they_end(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    handler = script("h.sh", HANDLER)
    cfg = write_config(
        f"redis: {{url: '{{redis}}'}}\nqueues:\n  a:\n    command: [{handler}]\n"
        "    concurrency: 10\n"
    )
    c = str(cfg)
    xs = [f"x{i}" for i in range(10)]
    for x in xs:
        assert jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", x).returncode == 0
    daemon(cfg)
    wait_until(lambda: r.hlen("{jobd:a}:active") == 10, what="the ten running records")
    assert not r.exists("{jobd:a}:taken")  # read with no waiter: not recorded
    for x in xs:  # a waiter for each, while it runs
        out = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", f"y{x}", "--after", x)
        assert out.returncode == 0, out.stderr
    assert r.hlen("{jobd:a}:taken") == 10  # wait_on.lua recorded each running job
    (tmp_path / "go").touch()
    for i in range(30):  # later plain jobs: their reads write nothing, so sweep nothing
        assert jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", f"z{i}").returncode == 0
    done = lambda: r.hlen("{jobd:a}:history") == 50 and not r.xpending("jobd:a", "jobd")["pending"]  # noqa: E731
    wait_until(lambda: done() and r.xlen("jobd:a") >= 50, 30, what="every job ended")
    wait_until(lambda: not r.hlen("{jobd:a}:active"), what="no job running")
    left = r.hlen("{jobd:a}:taken")
    assert left <= 2, f"{left} taken records of jobs that ended (nothing pending)"
