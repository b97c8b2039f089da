"""The daemon registry (issue 36): every running daemon listed by `jobd status` and the dashboard
with its host, pid, version, queues, running jobs and last heartbeat; a clean stop leaves at once
(and takes its empty consumers out of the groups, never one holding entries); a killed daemon is
shown dead once its lease lapsed; a frozen one stale, then alive again; garbage never breaks it."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import orjson
import redis
from support import DaemonProcess, acked_all, jobd_cli, wait_until

from jobd.store import registry

HANDLERS = """
    redis: {{url: '{{redis}}'}}
    shutdown_grace: 300ms
    defaults:
      lease: {{renew_every: 500ms, reclaim_after: {reclaim}}}
      kill_grace: 200ms
    queues:
"""


def config(write_config: Any, name: str, queues: dict[str, str], reclaim: str = "3s") -> Path:
    """A config named ``name`` with ``queues`` (queue -> its command, a YAML list)."""
    text = HANDLERS.format(reclaim=reclaim)
    text += "".join(f"      {q}: {{command: {cmd}}}\n" for q, cmd in queues.items())
    return write_config(text, f"{name}.yaml")


def status(path: Path) -> dict[str, Any]:
    done = jobd_cli("status", "-c", str(path), "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def listed(r: redis.Redis) -> dict[str, dict[str, Any]]:
    """The daemons the registry lists now, by consumer name (what `jobd status` reads)."""
    return {d["name"]: d for d in registry.listing(r)["daemons"]}


def consumers(r: redis.Redis, stream: str) -> dict[str, int]:
    """The consumers of group jobd on ``stream``, with their pending counts."""
    return {c["name"].decode(): c["pending"] for c in r.xinfo_consumers(stream, "jobd")}


def test_two_daemons_listed_and_one_stopped_leaves_at_once_with_its_empty_consumers(
    r: redis.Redis, daemon: Any, write_config: Any, script: Any
) -> None:
    script("slow.sh", "#!/bin/sh\nexec sleep 30\n")
    a = daemon(config(write_config, "a", {"q": "[/bin/true]", "r": "[./slow.sh]"}))
    b = daemon(config(write_config, "b", {"q": "[/bin/true]"}))
    name_a, name_b = a.consumer(), b.consumer()
    wait_until(lambda: {name_a, name_b} <= set(listed(r)), what="both listed")
    both = status(a.config)
    by_name = {d["name"]: d for d in both["daemons"]}
    assert [q["name"] for q in by_name[name_a]["queues"]] == ["q", "r"]
    assert [q["name"] for q in by_name[name_b]["queues"]] == ["q"]
    for d, pid in ((by_name[name_a], a.proc.pid), (by_name[name_b], b.proc.pid)):
        assert d["state"] == "alive" and d["pid"] == pid and d["version"] and d["host"]
        assert d["since_beat"] < d["lease"] and d["started"] <= d["beat"] and not d["problems"]
    assert by_name[name_a]["slots"] == 2 and by_name[name_b]["slots"] == 1
    # Listed as serving their queues whether they read from them yet or not (no job came yet:
    # on Redis < 7.2 neither is a consumer of either group).
    assert {d["name"] for d in both["queues"]["q"]["daemons"]} == {name_a, name_b}
    assert [d["name"] for d in both["queues"]["r"]["daemons"]] == [name_a]

    # a runs a job of r when it stops: handed back, it stays pending to a's consumer.
    r.xadd("jobd:r", {"payload": "x"})
    wait_until(lambda: consumers(r, "jobd:r").get(name_a) == 1, what="a running r's job")
    wait_until(lambda: listed(r)[name_a]["running"] == 1, what="a's beat counting it")
    r.execute_command("XGROUP", "CREATECONSUMER", "jobd:q", "jobd", name_a)  # as if it read q
    sent = time.monotonic()
    a.signal(signal.SIGTERM)
    wait_until(
        lambda: name_a not in listed(r), 2.0, "a gone from the registry"
    )  # what status reads
    gone_after = time.monotonic() - sent
    assert name_a not in {d["name"] for d in status(b.config)["daemons"]}
    assert a.proc.wait(10) == 0
    assert name_a not in consumers(r, "jobd:q")  # held nothing: removed
    assert consumers(r, "jobd:r") == {name_a: 1}  # holds the handed-back entry: kept
    assert r.xpending("jobd:r", "jobd")["pending"] == 1
    assert set(listed(r)) == {name_b}
    assert [d["name"] for d in status(b.config)["queues"]["q"]["daemons"]] == [name_b]
    print(f"gone from `jobd status` {gone_after:.2f}s after SIGTERM")


def test_a_killed_daemon_is_shown_dead_once_its_lease_lapsed_and_swept_later(
    r: redis.Redis, daemon: Any, write_config: Any
) -> None:
    path = config(write_config, "a", {"q": "[/bin/true]"}, reclaim="2s")
    a, b = daemon(path), daemon(path)
    name_a, name_b = a.consumer(), b.consumer()
    wait_until(lambda: {name_a, name_b} <= set(listed(r)))
    a.kill()
    killed = time.monotonic()
    while (shown := listed(r)[name_a])["state"] != "dead":
        assert shown["state"] in ("alive", "stale")
        assert time.monotonic() - killed < 10, shown
        time.sleep(0.05)
    assert time.monotonic() - killed >= 2.0 - 0.5 - 0.2  # its lease, less a beat and a margin
    assert shown["since_beat"] >= shown["lease"] == 2.0
    assert listed(r)[name_b]["state"] == "alive"
    text = jobd_cli("status", "-c", str(path))
    assert text.returncode == 0 and f"daemon {name_a}  DEAD" in text.stdout.decode()
    # Swept once its bound passed (10 x its lease: hastened here), by b's next beat.
    # Its record lives 10 x its lease (20 s) from its last beat, a beat (0.5 s) at most before
    # the kill: a fixed "> 15 s" failed on a loaded machine, slow to get here.
    since_kill_ms = (time.monotonic() - killed) * 1000
    assert r.pttl(f"{{jobd:daemons}}:daemon:{name_a}") > 20_000 - since_kill_ms - 1_000
    r.zadd("{jobd:daemons}:sweep", {name_a: 0})
    r.pexpire(f"{{jobd:daemons}}:daemon:{name_a}", 1)
    wait_until(lambda: r.zscore("{jobd:daemons}", name_a) is None, what="a swept")
    assert set(listed(r)) == {name_b}


def test_a_frozen_daemon_is_shown_stale_then_alive_again(
    r: redis.Redis, daemon: Any, write_config: Any
) -> None:
    a = daemon(config(write_config, "a", {"q": "[/bin/true]"}, reclaim="6s"))
    name = a.consumer()
    wait_until(lambda: listed(r).get(name, {}).get("state") == "alive")
    a.signal(signal.SIGSTOP)
    try:
        stale = wait_until(lambda: (d := listed(r)[name])["state"] == "stale" and d, 5.0)
        assert 1.5 <= stale["since_beat"] < 6.0  # three beats of 0.5s missed, not its lease
    finally:
        a.signal(signal.SIGCONT)
    wait_until(lambda: listed(r)[name]["state"] == "alive", 5.0, "alive again")


def test_a_registry_of_another_type_or_garbage_breaks_neither_status_nor_the_daemon(
    r: redis.Redis, daemon: Any, write_config: Any
) -> None:
    from jobd.config import load
    from jobd.web.dashboard import Dashboard

    path = config(write_config, "a", {"q": "[/bin/true]"})
    r.set("{jobd:daemons}", "someone else's")
    a: DaemonProcess = daemon(path)
    a.wait_log("the daemon registry's key {jobd:daemons} holds a string")
    r.xadd("jobd:q", {"payload": "x"})
    wait_until(lambda: acked_all(r, "jobd:q", 1), what="the job run all the same")
    shown = status(path)
    assert shown["daemons"] == [] and "{jobd:daemons} holds a string" in shown["daemons_error"]
    text = jobd_cli("status", "-c", str(path)).stdout.decode()
    assert "registry: the daemon registry's key {jobd:daemons} holds a string" in text

    r.delete("{jobd:daemons}")  # the daemon lists itself again at its next beat
    wait_until(lambda: a.consumer() in listed(r), 5.0)
    now_ms = int(r.time()[0]) * 1000
    r.zadd("{jobd:daemons}", {b"evil\xff": now_ms, "wrong": now_ms})
    r.hset(
        b"{jobd:daemons}:daemon:evil\xff", mapping={"pid": "-1", "queues": "[1", "running": "many"}
    )
    r.set("{jobd:daemons}:daemon:wrong", "x")
    shown = status(path)
    evil = next(d for d in shown["daemons"] if d["name"] == "evil\\xff")
    assert evil["pid"] is None and evil["queues"] == [] and evil["running"] is None
    assert any("queues is not a list" in p for p in evil["problems"])
    wrong = next(d for d in shown["daemons"] if d["name"] == "wrong")
    assert "is not a hash" in wrong["problems"][0]
    assert jobd_cli("status", "-c", str(path)).returncode == 0
    site = Dashboard(load(str(path)), client=r)
    replies: list[str] = []
    body = b"".join(site({"PATH_INFO": "/api/overview"}, lambda code, _: replies.append(code)))
    assert replies == ["200 OK"]
    overview = orjson.loads(body)
    assert {d["name"] for d in overview["daemons"]} == {a.consumer(), "evil\\xff", "wrong"}
    assert [d["name"] for d in overview["queues"]["q"]["daemons"]] == [a.consumer()]
    assert a.log().count("Traceback") <= 1  # the error logged whole once, not at each beat
    assert a.proc.poll() is None


def test_the_registry_on_a_cluster(cluster: Any, daemon: Any, tmp_path: Path) -> None:
    """On Redis Cluster the registry's keys share the slot of jobd:daemons: the beat is one script
    there, `jobd status` lists the daemon, and a clean stop removes it."""
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "redis:\n  cluster:\n    nodes: [" + ", ".join(cluster.nodes) + "]\n"
        "queues:\n  q: {command: [/bin/true]}\n"
    )
    d = daemon(path)
    shown = wait_until(lambda: (s := status(path))["daemons"] and s, what="the daemon listed")
    assert [x["name"] for x in shown["daemons"]] == [d.consumer()] and not shown["daemons_error"]
    assert shown["daemons"][0]["state"] == "alive"
    assert [x["name"] for x in shown["queues"]["q"]["daemons"]] == [d.consumer()]
    assert d.stop() == 0
    assert status(path)["daemons"] == []
