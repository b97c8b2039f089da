"""medium: a job whose handler exits 0 is dead-lettered (`enqueue`: "then: queue 'rb' is not in
the config") when, while it ran, a reload removed its queue's `then:` step together with the
step's queue: the running handler does not "finish under the definition it started with".

What is wrong: docs/operations/controls.md: "A valid one applies added, removed and changed
queues: running handlers finish under the definition they started with … A reload never drops,
duplicates or restarts a job", and the daemon logs "queue ra changed; running handlers finish as
they started". The handler keeps its queue's old `then:` (``handler.queue``), but
process/chains.py ``then_follow_ups`` looks each step's target up in the config in force at its
end (``queues``, the reloaded one): a target removed since is None, and the attempt fails for
good ("the config checked it: a queue removed on a reload since"). A reload that takes a chain
out (its step and its queue, the only valid way to remove the queue) thus dead-letters every job
of the queue running at that moment, with its work done: its `on_dead_letter` pages, a batch
counts it failed, the jobs waiting for it are dead-lettered `dependency`, and `jobd dlq
requeue` runs the work again.

Reproduce: queue ra (`then: [{queue: rb}]`) and rb; a job of ra is running; the config is
rewritten without rb and without ra's `then:`, SIGHUP; the handler exits 0: `jobd job ra r1`
says dead-lettered, error enqueue.

What should happen: the job is done, as the definition it started under says: its step's
follow-up added to rb's stream as that definition names it (rb drains as a removed queue does,
or waits for it to come back), or, at least, done without the step, the skip logged; never a
dead letter for a job whose handler succeeded. Why it matters: removing a step is a routine
change, and it turns the jobs in flight into failures with side effects already done.

Suggested fix: keep with the handler, at its start, the targets of its queue's `then:` steps
(their QueueConfig, as it keeps ``handler.queue``), and build the steps' follow-ups from those;
the same for the `max_payload` a step is checked against.

Fixed (review 35aa): the daemon keeps with each handler, at its start, the config's queues then
(``Handler.started_under``), and its follow-ups, its `then:` steps' and its JOBD_ENQUEUE file's,
go to their queues as that config defines them (``process.chains.targets``); a queue a reload
added while it ran is taken as the config in force defines it. The step's follow-up is added to
rb's stream, where it waits until a config serves rb again; a JOBD_ENQUEUE line naming a queue
the reload removed is taken the same way, one naming a queue the reload added is taken too.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli, wait_until

BEFORE = """\
redis: {url: '{redis}'}
queues:
  ra:
    command: [/bin/sh, -c, 'cat >/dev/null; touch {dir}/started; while [ ! -e {dir}/gate ]; do sleep 0.05; done']
    then: [{queue: rb, payload: payload}]
  rb:
    command: [/bin/true]
"""
AFTER = """\
redis: {url: '{redis}'}
queues:
  ra:
    command: [/bin/sh, -c, 'cat >/dev/null; touch {dir}/started; while [ ! -e {dir}/gate ]; do sleep 0.05; done']
"""


def test_a_job_running_across_a_reload_that_removes_its_step_is_done(
    r: redis.Redis, write_config, daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    path = write_config(BEFORE.replace("{dir}", str(tmp_path)))
    cfg = str(path)
    d = daemon(path)
    assert jobd_cli("enqueue", "-c", cfg, "ra", "p", "--job-id", "r1").returncode == 0
    wait_until((tmp_path / "started").exists, what="r1 running")
    write_config(AFTER.replace("{dir}", str(tmp_path)))
    d.signal(signal.SIGHUP)
    d.wait_log("reload done")
    (tmp_path / "gate").touch()

    def state() -> str:
        got = jobd_cli("job", "--json", "-c", cfg, "ra", "r1")
        return json.loads(got.stdout)["state"] if got.returncode == 0 else ""

    wait_until(lambda: state() in ("done", "dead-lettered"), what="r1 ended")
    got = json.loads(jobd_cli("job", "--json", "-c", cfg, "ra", "r1").stdout)
    assert got["state"] == "done", got["records"][-1]
    # its step's follow-up, in rb's stream as the definition it started under said
    ((_, f),) = r.xrange("jobd:rb")
    assert (f[b"job_id"], f[b"payload"]) == (b"r1.then.1", b"p")


# ra's handler writes two follow-ups once the gate is there: one into rb, which the reload
# removes, one into rc, which it adds.
WRITES = (
    "cat >/dev/null; touch {dir}/started; while [ ! -e {dir}/gate ]; do sleep 0.05; done; "
    """printf '%s\\n' '{"queue": "rb", "payload": "old"}' '{"queue": "rc", "payload": "new"}' """
    '> "$JOBD_ENQUEUE"'
)
FILE_BEFORE = """\
redis: {url: '{redis}'}
queues:
  ra:
    command: [/bin/sh, -c, 'WRITES']
  rb:
    command: [/bin/true]
"""
FILE_AFTER = """\
redis: {url: '{redis}'}
queues:
  ra:
    command: [/bin/sh, -c, 'WRITES']
  rc:
    command: [/bin/true]
"""


def test_a_follow_up_file_naming_a_queue_removed_or_added_meanwhile_is_taken(
    r: redis.Redis, write_config, daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    def text(template: str) -> str:
        command = WRITES.replace("{dir}", str(tmp_path)).replace("'", "''")
        return template.replace("WRITES", command)

    path = write_config(text(FILE_BEFORE))
    cfg = str(path)
    d = daemon(path)
    assert jobd_cli("enqueue", "-c", cfg, "ra", "p", "--job-id", "r1").returncode == 0
    wait_until((tmp_path / "started").exists, what="r1 running")
    write_config(text(FILE_AFTER))
    d.signal(signal.SIGHUP)
    d.wait_log("reload done")
    (tmp_path / "gate").touch()

    def state(queue: str, job: str) -> str:
        got = jobd_cli("job", "--json", "-c", cfg, queue, job)
        return json.loads(got.stdout)["state"] if got.returncode == 0 else ""

    wait_until(lambda: state("ra", "r1") in ("done", "dead-lettered"), what="r1 ended")
    got = json.loads(jobd_cli("job", "--json", "-c", cfg, "ra", "r1").stdout)
    assert got["state"] == "done", got["records"][-1]
    ((_, f),) = r.xrange("jobd:rb")  # the removed queue's: waits there, nobody reads it
    assert (f[b"job_id"], f[b"payload"]) == (b"r1.1", b"old")
    wait_until(lambda: state("rc", "r1.2") == "done", what="rc's follow-up done")
