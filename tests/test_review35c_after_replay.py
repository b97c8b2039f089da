"""Review of issue 35 (workflows), round 4 (review35c): `jobd enqueue --after` interrupted (a lost
reply), then run again with the same --job-id as docs/workflows.md says to ("can be run again
with the same `--job-id`: holding, registering and counting are each done once"). hold.lua held
the job again once its first hold had ended (released, dead-lettered), so it ran (or was
dead-lettered) twice; a hold that ended is now remembered in the queue's held:ended set for
history.max_age (lib/workflows.lua hold_ended), and hold.lua answers "ended already". One test
per interleaving: the release done by the enqueue, by a daemon (also in a queue that keeps no
history); the job run already, not read yet; dead-lettered at once, past its bound; in a batch;
on the three-master cluster; the window's end; a cancel (which frees the job id); someone
else's key where the ends are kept. Real daemon and handlers; the lost replies through
tests/faultproxy.py, which holds the reply of one call (the call ran in Redis) and then cuts
the connection."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from faultproxy import FaultProxy
from redis.cluster import RedisCluster
from support import DaemonProcess, LocalCluster, RedisServer, jobd_cli, wait_until
from test_after_batches import CALLBACK, RUNS, batch_yaml, runs

Daemon = Callable[..., DaemonProcess]
HELD, ENDED, DEAD = "{jobd:a}:held", "{jobd:a}:held:ended", "{jobd:a}:dead"


def idle(r: redis.Redis, stream: str) -> bool:
    """Every entry of ``stream`` read and acknowledged by the daemon's group."""
    groups = r.xinfo_groups(stream) if r.exists(stream) else []
    return bool(groups) and all(g["pending"] == 0 and g["lag"] == 0 for g in groups)


def config(write_config, script, extra: str = "") -> Path:
    return write_config("redis: {url: '{redis}'}\n"
                        + batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK), extra))  # fmt: skip


def enqueue(cfg: Path, *args: str) -> None:
    out = jobd_cli("enqueue", "-c", str(cfg), "a", *args)
    assert out.returncode == 0, out.stderr


def done(r: redis.Redis, tmp_path: Path, cfg: Path, job_id: str) -> None:
    """Job ``job_id`` of queue a enqueued and run (a daemon runs)."""
    enqueue(cfg, job_id, "--job-id", job_id)
    wait_until(lambda: job_id in runs(tmp_path) and idle(r, "jobd:a"), what=f"{job_id} done")


def redis_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def lost_reply(proxy: FaultProxy, cmd: list[str], reply: bytes) -> subprocess.Popen:
    """``cmd`` (an enqueue through ``proxy``) run, the first script reply holding ``reply``
    held, then its connection cut; the process, ended."""
    proxy.hold_reply(reply, to=b"EVALSHA")
    enqueue = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_until(lambda: proxy.holding() == 1, what=f"the reply {reply!r} held")
    proxy.cut()
    enqueue.communicate(timeout=60)
    proxy.release()
    return enqueue


def test_an_after_enqueue_whose_release_reply_is_lost_runs_its_job_once(
    r: redis.Redis, redis_server: RedisServer, write_config, script, daemon: Daemon,
    tmp_path: Path,
) -> None:  # fmt: skip
    """`jobd enqueue --after x --job-id h` where x is done already: the enqueue holds h,
    finds x ended, and releases h itself (unblock.lua). That release's reply lost (the
    connection cut), the enqueue fails, and the user runs the same command again, as the docs
    say to: hold.lua found h no longer held (released), held it again, and the second run
    released it again: h was added to its stream twice and ran twice."""
    queues = batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK))
    with FaultProxy(redis_server.port) as proxy:
        direct = write_config("redis: {url: '{redis}'}\n" + queues)
        proxied = write_config(f"redis: {{url: '{proxy.url}'}}\n" + queues, name="proxied.yaml")
        daemon(direct)
        done(r, tmp_path, direct, "x")
        cmd = [sys.executable, "-m", "jobd", "enqueue", "-c", str(proxied), "a", "h",
               "--job-id", "h", "--after", "x"]  # fmt: skip
        reran = lost_reply(proxy, cmd, b"released").returncode != 0
        if reran:  # as the docs say: the same command again
            again = jobd_cli(*cmd[3:])
            assert again.returncode == 0, again.stderr
    wait_until(lambda: "h" in runs(tmp_path) and idle(r, "jobd:a"), what="h run")
    assert r.xlen("jobd:a") == 2, (
        f"h added {r.xlen('jobd:a') - 1} times (enqueue run again: {reran})"
    )
    assert runs(tmp_path).count("h") == 1, runs(tmp_path)


@pytest.mark.parametrize("history", ["", "    history: {maxlen: 0}\n"], ids=["kept", "none"])
def test_an_after_enqueue_run_again_once_a_daemon_released_and_ran_its_job_adds_nothing(
    r: redis.Redis, redis_server: RedisServer, write_config, script, daemon: Daemon,
    tmp_path: Path, history: str,
) -> None:  # fmt: skip
    """`jobd enqueue --after x --job-id h` before x is enqueued: h held, then registered with
    x, that reply lost (the enqueue fails). x is enqueued and done: the daemon releases h
    (unblock.lua, moving x's notice), h runs. The user runs the enqueue again: h was held
    again, found x ended and was released again: it ran twice. Now: exit 0, nothing added.
    Also in a queue that keeps no history (maxlen 0), where x's end is no record: h was held
    again for good, waiting for x's next end (the end of a hold is remembered apart)."""
    queues = batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK), history)
    with FaultProxy(redis_server.port) as proxy:
        direct = write_config("redis: {url: '{redis}'}\n" + queues)
        proxied = write_config(f"redis: {{url: '{proxy.url}'}}\n" + queues, name="proxied.yaml")
        cmd = [sys.executable, "-m", "jobd", "enqueue", "-c", str(proxied), "a", "h",
               "--job-id", "h", "--after", "x"]  # fmt: skip
        lost_reply(proxy, cmd, b"waiting")
    assert r.hexists(HELD, "h")
    daemon(direct)
    done(r, tmp_path, direct, "x")
    wait_until(lambda: "h" in runs(tmp_path) and idle(r, "jobd:a"), what="h released and run")
    again = jobd_cli("enqueue", "-c", str(direct), *cmd[6:])  # the same, Redis reachable
    assert again.returncode == 0, again.stderr
    assert again.stdout == b"h\n"
    assert not r.hexists(HELD, "h"), "h held again"
    assert r.xlen("jobd:a") == 2, f"h added {r.xlen('jobd:a') - 1} times"
    wait_until(lambda: idle(r, "jobd:a"), what="the queue idle")
    assert runs(tmp_path).count("h") == 1, runs(tmp_path)


def test_an_after_enqueue_run_again_while_its_released_job_waits_unread_adds_nothing(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """x done; the queue paused; h (--after x) released at once into the stream, not read yet:
    the same command again added h a second time (it ran twice once the queue was resumed)."""
    cfg = config(write_config, script)
    daemon(cfg)
    done(r, tmp_path, cfg, "x")
    assert jobd_cli("pause", "-c", str(cfg), "a").returncode == 0
    enqueue(cfg, "h", "--job-id", "h", "--after", "x")
    enqueue(cfg, "h", "--job-id", "h", "--after", "x")
    assert r.xlen("jobd:a") == 2, f"h added {r.xlen('jobd:a') - 1} times"
    assert jobd_cli("resume", "-c", str(cfg), "a").returncode == 0
    wait_until(lambda: "h" in runs(tmp_path) and idle(r, "jobd:a"), what="h run")
    assert runs(tmp_path).count("h") == 1, runs(tmp_path)


def test_an_after_enqueue_run_again_after_its_job_was_dead_lettered_dependency_adds_nothing(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """x failed (dead-lettered); h --after x is dead-lettered `dependency` by the enqueue
    itself. The same command again held h again and dead-lettered it again: two dead letters
    (and two on_dead_letter jobs, two failures in its batch's counts)."""
    cfg = config(write_config, script)
    daemon(cfg)
    enqueue(cfg, "fail", "--job-id", "x")
    wait_until(lambda: r.xlen(DEAD) == 1, what="x dead-lettered")
    enqueue(cfg, "h", "--job-id", "h", "--after", "x")
    assert [f[b"jobd_job_id"] for _, f in r.xrange(DEAD)] == [b"x", b"h"]
    enqueue(cfg, "h", "--job-id", "h", "--after", "x")
    assert [f[b"jobd_job_id"] for _, f in r.xrange(DEAD)] == [b"x", b"h"]
    assert not r.hexists(HELD, "h")


def test_an_after_enqueue_run_again_after_its_bound_passed_holds_nothing(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """h --after x (never enqueued) --after-timeout 1s: the daemons' duty dead-letters it past
    its bound (expire_held.lua). The same command again held h anew, for another second and
    another dead letter (or, x enqueued meanwhile, to run after all)."""
    cfg = config(write_config, script)
    daemon(cfg)
    cmd = ("h", "--job-id", "h", "--after", "x", "--after-timeout", "1s")
    enqueue(cfg, *cmd)
    wait_until(lambda: r.xlen(DEAD) == 1, what="h dead-lettered past its bound")
    enqueue(cfg, *cmd)
    assert not r.hexists(HELD, "h"), "h held again"
    assert r.xlen(DEAD) == 1


def test_an_after_enqueue_into_a_batch_run_again_once_released_counts_no_new_member(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Batch B: p held (--after y, never enqueued: B stays pending), and h --after x (done),
    released at once. The same command for h again counted a third member in B and ran h
    again."""
    cfg = config(write_config, script)
    daemon(cfg)
    done(r, tmp_path, cfg, "x")
    enqueue(cfg, "p", "--job-id", "p", "--after", "y", "--batch", "B")
    cmd = ("h", "--job-id", "h", "--after", "x", "--batch", "B")
    enqueue(cfg, *cmd)
    wait_until(lambda: "h" in runs(tmp_path) and idle(r, "jobd:a"), what="h run")
    enqueue(cfg, *cmd)
    wait_until(lambda: idle(r, "jobd:a") and r.xlen("{jobd:a}:outbox") == 0, what="moved")
    assert r.hget("{jobd:batch:B}", "total") == b"2"
    assert runs(tmp_path).count("h") == 1, runs(tmp_path)


def test_a_hold_ended_is_remembered_for_history_max_age_on_redis_clock_then_held_anew(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """The window (docs/workflows.md): the queue's history.max_age from the hold's end, on
    Redis's clock (the entry's score in {S}:held:ended); past it the same command is a new job,
    held anew (and released again if x's record is still there)."""
    cfg = config(write_config, script, "    history: {max_age: 5s}\n")
    daemon(cfg)
    enqueue(cfg, "h", "--job-id", "h", "--after", "x")
    before = redis_ms(r)
    enqueue(cfg, "x", "--job-id", "x")
    until = wait_until(lambda: r.zscore(ENDED, "h"), what="h released")
    after = redis_ms(r)
    assert before + 5000 <= until <= after + 5000, (before, until, after)
    enqueue(cfg, "h", "--job-id", "h", "--after", "x")
    assert redis_ms(r) < until, "too slow: the window passed before the enqueue ran again"
    assert r.xlen("jobd:a") == 2 and not r.hexists(HELD, "h")
    wait_until(lambda: redis_ms(r) > until, what="the window passed")
    enqueue(cfg, "h", "--job-id", "h", "--after", "x")
    assert r.hexists(HELD, "h") or r.xlen("jobd:a") == 3, "the job id's hold not free again"


def test_a_held_job_cancelled_leaves_its_job_id_free_for_a_new_hold(
    r: redis.Redis, write_config, script
) -> None:
    """A cancel where it waits is an end the operator chose: nothing remembered, so that the
    job id enqueued --after again is held anew (docs: "The job id is free again")."""
    cfg = config(write_config, script)
    enqueue(cfg, "h", "--job-id", "h", "--after", "x")
    out = jobd_cli("cancel", "-c", str(cfg), "a", "h")
    assert out.returncode == 0 and b"held" in out.stdout, out
    assert not r.exists(ENDED)
    enqueue(cfg, "h", "--job-id", "h", "--after", "x")
    assert r.hexists(HELD, "h")


def test_on_a_cluster_an_after_enqueue_run_again_adds_its_job_once(
    cluster: LocalCluster, script, daemon: Daemon, tmp_path: Path
) -> None:
    """The three-master cluster, each job waited for in another queue's slot: h released by
    its enqueue (b:x done already), g by a daemon moving b:y's notice; each enqueue run again
    once its job ran adds nothing (the held:ended set is in the held job's slot)."""
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(f"redis:\n  cluster:\n    nodes: [{cluster.nodes[0]}]\n"
                   + batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK), "", "rr:"))  # fmt: skip
    client = RedisCluster.from_url(f"redis://{cluster.nodes[0]}")
    assert client.keyslot("rr:a") != client.keyslot("rr:b")
    c = str(cfg)

    def cli(*args: str) -> None:
        out = jobd_cli("enqueue", "-c", c, *args)
        assert out.returncode == 0, out.stderr

    try:
        daemon(cfg)
        cli("b", "x", "--job-id", "x")
        wait_until(lambda: "x" in runs(tmp_path), what="x done")
        cli("a", "g", "--job-id", "g", "--after", "b:y")
        cli("a", "h", "--job-id", "h", "--after", "b:x")
        cli("b", "y", "--job-id", "y")
        wait_until(lambda: {"g", "h"} <= set(runs(tmp_path)), what="g and h run")
        cli("a", "h", "--job-id", "h", "--after", "b:x")
        cli("a", "g", "--job-id", "g", "--after", "b:y")
        assert client.xlen("rr:a") == 2 and client.hlen("{rr:a}:held") == 0
        assert client.zcard("{rr:a}:held:ended") == 2
        wait_until(lambda: client.xlen("{rr:b}:outbox") == 0, what="the outbox moved")
        assert sorted(runs(tmp_path)) == ["g", "h", "x", "y"]
    finally:
        client.close()


def test_someone_elses_key_at_held_ended_never_stops_a_release(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """{S}:held:ended a string (someone else's key): the hold's end is not remembered, but the
    release is never refused for it (a script stopped half-way would leave the notice in the
    outbox for ever), and hold.lua reads the key as holding nothing."""
    cfg = config(write_config, script)
    r.set(ENDED, "not jobd's")
    daemon(cfg)
    enqueue(cfg, "g", "--job-id", "g", "--after", "x")
    done(r, tmp_path, cfg, "x")
    wait_until(lambda: "g" in runs(tmp_path), what="g released by a daemon and run")
    enqueue(cfg, "h", "--job-id", "h", "--after", "x")
    wait_until(lambda: "h" in runs(tmp_path), what="h released by its enqueue and run")
    assert r.get(ENDED) == b"not jobd's"
