"""Review of issue 35 (workflows), round 3: a batch calls back once "when the last member
settles" also when a reply is lost, a call is sent again, or the enqueue dies between two of
its calls. Real daemons and handlers; the enqueues reach the session's private Redis through
the fault-injecting proxy (tests/faultproxy.py), which holds the reply of one batch call (the
call ran in Redis) and then cuts the connection: the classic "did my write happen?" case.
Each test failed before its fix (the failure is in the test's docstring)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from faultproxy import FaultProxy
from support import DaemonProcess, RedisServer, jobd_cli, wait_until
from test_after_batches import CALLBACK, RUNS, batch_yaml, callbacks

from jobd import producer
from jobd.config import load
from jobd.newjob import NewJob
from jobd.store import connection
from jobd.store.store import Store
from jobd.store.workflows import callback_spec

Daemon = Callable[..., DaemonProcess]


def configs(write_config, script, proxy: FaultProxy) -> tuple[Path, Path]:
    """The daemons' config (straight to Redis) and the enqueues' (through the proxy)."""
    queues = batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK))
    direct = write_config("redis: {url: '{redis}'}\n" + queues)
    proxied = write_config(f"redis: {{url: '{proxy.url}'}}\n" + queues, name="proxied.yaml")
    return direct, proxied


def shown(cfg: Path, batch: str) -> dict:
    return json.loads(jobd_cli("batch", "-c", str(cfg), batch, "--json").stdout or "{}")


def moved(r: redis.Redis) -> bool:
    return not r.exists("{jobd:a}:outbox") or r.xlen("{jobd:a}:outbox") == 0


def settled(r: redis.Redis, cfg: Path, batch: str, total: int) -> None:
    """Every one of the ``total`` jobs of queue a ended and told its batch, nothing left in
    the outbox to move: the batch's counts are final, and the callback came or never will."""

    def ended() -> bool:
        b = shown(cfg, batch)
        return r.xlen("jobd:a") == total and b.get("done", 0) + b.get("failed", 0) == total

    wait_until(ended, 30, what=f"the {total} members of {batch} ended and counted")
    wait_until(lambda: moved(r), what="the outbox moved")


def test_an_open_whose_reply_is_lost_leaves_no_adder_behind(
    r: redis.Redis, redis_server: RedisServer, write_config, script, daemon: Daemon,
    tmp_path: Path,
) -> None:  # fmt: skip
    """`jobd enqueue --batch` whose `open` ran in Redis but whose reply was lost: the enqueue
    failed (exit 69) with an adder counted open that nobody would ever seal, and the enqueue
    run again (what a user does) added the job and sealed only its own: the batch stayed
    `open` with its one member done, no callback, for good. Now the enqueue sends the call
    again with its token, Redis knows it, and the batch completes once."""
    with FaultProxy(redis_server.port) as proxy:
        direct, proxied = configs(write_config, script, proxy)
        daemon(direct)
        proxy.hold_reply(b"open", to=b"$4\r\nopen\r\n")
        cmd = [sys.executable, "-m", "jobd", "enqueue", "-c", str(proxied), "a", "x",
               "--batch", "O", "--on-complete", "cb"]  # fmt: skip
        enqueue = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_until(lambda: proxy.holding() == 1, what="the open's reply held")
        proxy.cut()
        _, err = enqueue.communicate(timeout=60)
        if enqueue.returncode != 0:  # as a user does: the same command again
            again = jobd_cli(*cmd[3:])
            assert again.returncode == 0, again.stderr
    settled(r, direct, "O", 1)
    assert shown(direct, "O") == {"batch": "O", "state": "complete", "total": 1, "done": 1,
                                  "failed": 0, "pending": 0, "on_complete": "cb"}  # fmt: skip
    wait_until(lambda: callbacks(tmp_path), what="the callback")
    assert [c["total"] for c in callbacks(tmp_path)] == [1]
    assert enqueue.returncode == 0, err  # and the enqueue said it was done


def test_an_add_whose_reply_is_lost_is_counted_once(
    r: redis.Redis, redis_server: RedisServer, write_config, script, daemon: Daemon,
    tmp_path: Path,
) -> None:  # fmt: skip
    """`producer.enqueue_many` into a batch whose `add` (the jobs counted before their round
    trip) ran in Redis but lost its reply: Interrupted, the batch's total 2 with no job added;
    the call made again (what a caller does) made it 4 for 2 jobs: the batch never completed.
    Now the add is sent again with the same token and number, and counted once."""
    with FaultProxy(redis_server.port) as proxy:
        direct, proxied = configs(write_config, script, proxy)
        config = load(str(proxied))
        daemon(direct)
        jobs = [NewJob(f"p{n}".encode(), batch="A", on_complete="cb") for n in range(2)]
        proxy.hold_reply(b"open", to=b"$3\r\nadd\r\n")
        failed: list[BaseException] = []

        def enqueue() -> None:
            try:
                producer.enqueue_many(config, "a", jobs)
            except producer.ProducerError as exc:
                failed.append(exc)

        thread = threading.Thread(target=enqueue)
        thread.start()
        wait_until(lambda: proxy.holding() == 1, what="the add's reply held")
        proxy.cut()
        thread.join(60)
        if failed:  # as a caller does: the same jobs again
            producer.enqueue_many(config, "a", jobs)
    settled(r, direct, "A", 2)
    assert shown(direct, "A")["state"] == "complete", shown(direct, "A")
    wait_until(lambda: callbacks(tmp_path), what="the callback")
    assert [c["total"] for c in callbacks(tmp_path)] == [2]
    assert not failed, failed


# One job into batch S (one round trip of one job), then waits for a line on stdin before it
# ends: its member can end, and be counted, before the enqueue seals the batch.
GATED_ENQUEUE = """\
import sys
from jobd import producer
from jobd.config import load
from jobd.newjob import NewJob
from jobd.store import connection

def jobs():
    yield NewJob(b"y", "y", batch="S", on_complete="cb")
    print("sent", flush=True)
    sys.stdin.readline()

producer.enqueue_many(load(sys.argv[1]), "a", jobs(), batch=1)
print("sealed", flush=True)
"""


@pytest.mark.parametrize("fault", ["enqueue killed", "Redis gone"])
def test_a_seal_that_completes_the_batch_calls_back_whatever_happens_next(
    r: redis.Redis, redis_server: RedisServer, write_config, script, daemon: Daemon,
    tmp_path: Path, fault: str,
) -> None:  # fmt: skip
    """An enqueue whose members all ended before it sealed the batch: its seal completes the
    batch, and the callback was the enqueue's next call. The enqueue SIGKILLed between the two
    (or Redis gone: the seal's reply lost), no notice was left for anyone to finish it: the
    batch stayed complete with no callback, for good. Now the seal is a notice in the queue's
    outbox, written before it is applied: a daemon's outbox mover applies it again (once) and
    adds the callback (once)."""
    code = tmp_path / "gated.py"
    code.write_text(GATED_ENQUEUE)
    with FaultProxy(redis_server.port) as proxy:
        direct, proxied = configs(write_config, script, proxy)
        daemon(direct)
        gated = [sys.executable, str(code), str(proxied)]
        with subprocess.Popen(gated, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as enqueue:
            assert enqueue.stdin is not None and enqueue.stdout is not None
            assert enqueue.stdout.readline() == b"sent\n"
            wait_until(lambda: shown(direct, "S").get("done") == 1, what="y ended and counted")
            assert shown(direct, "S")["state"] == "open"  # the enqueue has not sealed it yet
            proxy.hold_reply(b"complete", to=b"$4\r\nseal\r\n")
            enqueue.stdin.write(b"go\n")
            enqueue.stdin.flush()
            wait_until(lambda: proxy.holding() == 1, what="the seal's reply held")
            if fault == "enqueue killed":
                os.kill(enqueue.pid, signal.SIGKILL)
            else:
                proxy.cut()
            enqueue.wait(60)
        proxy.release()
    assert shown(direct, "S")["state"] == "complete"  # the seal ran
    wait_until(lambda: callbacks(tmp_path), 15, what="the callback")
    wait_until(lambda: moved(r), what="the outbox moved")
    assert callbacks(tmp_path) == [{"batch": "S", "state": "complete", "total": 1, "done": 1,
                                    "failed": 0, "pending": 0}]  # fmt: skip
    assert r.xlen("jobd:cb") == 1


def test_every_batch_call_sent_twice_changes_the_batch_once(
    r: redis.Redis, write_config, script
) -> None:
    """batch.lua's calls as a caller sends them again after a lost reply (the same arguments):
    `open` counted a second adder that never sealed, `add` counted its jobs twice, `seal` took
    off another adder's open (the batch completed while that one still added). Each now names
    its enqueue's token, and an add its number in that enqueue's calls: a call seen already
    changes nothing, and says what the batch is."""
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    config = load(str(cfg))
    store = Store(r)
    spec = callback_spec(config.queues["cb"])

    def twice(op: str, *args: object) -> tuple[str, int, int]:
        first, second = (store.batch_op("R", op, *args) for _ in range(2))
        assert first is not None and first == second, (op, args, first, second)
        return first.state, first.total, first.done

    assert twice("open", "t1", 60, "cb", spec) == ("open", 0, 0)
    assert twice("open", "t2", 60, "", b"") == ("open", 0, 0)
    assert twice("add", "t1", 1, 3) == ("open", 3, 0)  # t1: 3 jobs counted
    assert twice("add", "t1", 2, 2) == ("open", 2, 0)  # one of them refused
    assert twice("seal", "t1", 3, 2) == ("open", 2, 0)  # t2 still adds
    assert store.batch_op("R", "add", "t1", 1, 3).total == 2  # a late copy of t1's first add
    for n in range(2):
        assert twice("count", f"{{jobd:a}}:outbox 1-{n}", "done")[2] == n + 1
    assert twice("seal", "t2", 1, 0) == ("complete", 2, 2)


def test_a_held_member_enqueued_again_is_counted_once(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """`jobd enqueue --after x --batch H` run again with the same --job-id (what the docs say to
    do with one that was interrupted): hold.lua holds the job once, but the batch counted it
    at each run: total 2 for one member, and the batch never completed."""
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    held = ["enqueue", "-c", str(cfg), "a", "h", "--job-id", "h", "--after", "x", "--batch", "H",
            "--on-complete", "cb"]  # fmt: skip
    for _ in range(2):
        assert jobd_cli(*held).returncode == 0
    assert jobd_cli("enqueue", "-c", str(cfg), "a", "x", "--job-id", "x").returncode == 0
    daemon(cfg)
    wait_until(lambda: shown(cfg, "H").get("done") == 1, what="h released, run and counted")
    wait_until(lambda: moved(r), what="the outbox moved")
    assert shown(cfg, "H")["total"] == 1, shown(cfg, "H")
    wait_until(lambda: callbacks(tmp_path), what="the callback")
    assert [c["total"] for c in callbacks(tmp_path)] == [1]


def test_a_batch_and_a_held_job_under_the_documented_acl_user(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """The documented ACL user (connection.ACL_COMMANDS) lacked SISMEMBER and SADD (batch.lua
    counts a member's end) and HEXISTS (hold.lua, and batch.lua's open now): a batch under it
    never completed (every notice's move refused, NOPERM), a job --after another was never
    held (the enqueue failed). Later SCARD (a seal that counted nothing: an enqueue refused
    with NOPERM after its job was held)."""
    from test_redis_auth import PASSWORD

    rules = ["on", f">{PASSWORD}", "~jobd:*", "~{jobd:*", "resetchannels", "-@all"]
    rules += [f"+{command}" for command in connection.ACL_COMMANDS]
    r.execute_command("ACL", "SETUSER", "jobd-flows", "reset", *rules)
    try:
        (tmp_path / "redis.password").write_text(PASSWORD + "\n")
        auth = "{url: '{redis}', username: jobd-flows, password_file: redis.password}"
        cfg = write_config(f"redis: {auth}\n"
                           + batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
        daemon(cfg)
        enqueue = ["enqueue", "-c", str(cfg), "a"]
        out = jobd_cli(*enqueue, "w", "--job-id", "w", "--after", "x", "--batch", "L",
                       "--on-complete", "cb")  # fmt: skip
        assert out.returncode == 0, out.stderr
        # sent again into another batch: held already, nothing added, the empty seal (SCARD)
        out = jobd_cli(*enqueue, "w", "--job-id", "w", "--after", "x", "--batch", "N")
        assert out.returncode == 0, out.stderr
        out = jobd_cli(*enqueue, "x", "--job-id", "x", "--batch", "L")
        assert out.returncode == 0, out.stderr
        wait_until(lambda: callbacks(tmp_path), 20, what="the callback")
        assert [(c["total"], c["done"]) for c in callbacks(tmp_path)] == [(2, 2)]
    finally:
        r.acl_deluser("jobd-flows")
