"""medium: a reload that lowers a `then:` target's `max_payload` while a parent runs lets the
parent's follow-up through under the old limit; the target queue then dead-letters it unrun
(malformed: "payload of N bytes is above max_payload"), its parent counted done.

What is wrong: since review 35aa (f35aab) a handler's follow-ups are resolved against the config
it started under (``Handler.started_under``; process/chains.py ``targets`` merges it *over* the
config in force: ``{**queues, **started}``), so for a target queue that both configs define, the
old definition wins: its `max_payload` is the one checked (chains.py ``then_follow_ups``; the
same in followups.py for a JOBD_ENQUEUE line). But the daemon that reads the follow-up checks it
against the `max_payload` in force (process/policy.py: "payload of N bytes is above
max_payload"), and dead-letters it unrun. Review 35y's rule ("nothing is added that its queue
dead-letters unrun", FollowUp checks at parse) and docs/workflows.md ("A payload above the target
queue's `max_payload` dead-letters the job (`enqueue`), and no follow-up of it ... is enqueued")
no longer hold across a reload: the parent is done, its batch and waiters told so, and the work
it handed on is a dead letter of the child, which `jobd dlq requeue` cannot run either (the same
limit refuses it).

Reproduce: queue ra (`then: [{queue: rb, payload: payload}]`), rb with `max_payload: 1KiB`; a
job of ra with a 200-byte payload is running; the config is rewritten with rb's `max_payload:
64`, SIGHUP; the handler exits 0: ra's r1 is done, rb's r1.then.1 is dead-lettered unrun.

What should happen: a queue that the config in force still defines is taken as it defines it
(its `max_payload`, and its stream: a reload that moves rb to another stream sends an old
handler's follow-up to the stream nobody reads any more, the same precedence); the started-under
definition only for a queue the reload removed. Then the parent fails `enqueue` as the docs say,
and nothing is added that its queue dead-letters unrun.

Suggested fix: in ``chains.targets`` merge the other way, ``{**started, **queues}`` (the config
in force wins, a removed queue comes from the start-time config); update docs/operations/
controls.md ("their streams, their max_payload") and the diary entry of 2026-12-07. Checked:
with that one change this test and review 35aa's reload tests pass.

Fixed (review 35ab, by the lead): ``chains.targets`` merges ``{**started, **queues}``: a queue
the config in force defines is taken as it defines it (stream, max_payload); only a queue the
reload removed comes from the config the handler started under. The parent is dead-lettered
``enqueue``, nothing is added to rb.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli, wait_until

CONFIG = """\
redis: {url: '{redis}'}
queues:
  ra:
    command: [/bin/sh, -c, 'cat >/dev/null; touch {dir}/started; while [ ! -e {dir}/gate ]; do sleep 0.05; done']
    then: [{queue: rb, payload: payload}]
  rb:
    command: [/bin/true]
    max_payload: MOST
"""


def test_a_follow_up_is_checked_against_the_target_max_payload_in_force(
    r: redis.Redis, write_config, daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    text = CONFIG.replace("{dir}", str(tmp_path))
    path = write_config(text.replace("MOST", "1KiB"))
    cfg = str(path)
    d = daemon(path)
    assert jobd_cli("enqueue", "-c", cfg, "ra", "x" * 200, "--job-id", "r1").returncode == 0
    wait_until((tmp_path / "started").exists, what="r1 running")
    write_config(text.replace("MOST", "64"))
    d.signal(signal.SIGHUP)
    d.wait_log("reload done")
    (tmp_path / "gate").touch()

    def state(queue: str, job: str) -> str:
        got = jobd_cli("job", "--json", "-c", cfg, queue, job)
        return json.loads(got.stdout)["state"] if got.returncode == 0 else ""

    ended = ("done", "dead-lettered")
    wait_until(lambda: state("ra", "r1") in ended, what="r1 ended")
    if state("ra", "r1") == "dead-lettered":  # refused at its end, as the docs say: no child
        assert r.xlen("jobd:rb") == 0
        return
    # r1 done: its child was added to rb; rb must be able to run it
    wait_until(lambda: state("rb", "r1.then.1") in ended, what="r1.then.1 ended")
    got = json.loads(jobd_cli("job", "--json", "-c", cfg, "rb", "r1.then.1").stdout)
    assert got["state"] == "done", got["records"][-1]
