"""What an open dashboard costs its server and Redis, with many queues.

    python bench/dashboard_cost.py [--queues 50] [--seconds 5] [--rounds 3]

A private redis-server and `jobd dashboard` with ``--queues`` queues, each with a consumer group,
a few hundred entries, dead letters, delayed jobs and an hour of per-minute figures. Then, per
round, in alternating order, the requests one open page makes in 5 s, sent back to back for
``--seconds``:

- ``old``: the page before issue 36: ``/api/overview`` every 5 s (every queue's figures, dead
  letters, delayed and running jobs);
- ``overview``: the overview now: ``/api/summary`` once and ``/api/daemons`` five times;
- ``queue``: a queue's page: ``/api/queue`` and ``/api/jobs`` (a page of 50 waiting jobs) once,
  the daemons are not polled there.

For each: requests a second the server answers, and per 5 s of an open page (one "refresh") the
server's CPU (its /proc/PID/stat) and Redis's (INFO cpu) in ms; then the medians and the ratio of
each to ``old``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spawn import free_port, start_redis, wait_until

TICK = os.sysconf("SC_CLK_TCK")
KINDS = {
    "old": [("/api/overview", 1)],
    "overview": [("/api/summary", 1), ("/api/daemons", 5)],
    "queue": [("/api/queue?queue=q0", 1), ("/api/jobs?queue=q0&state=waiting&count=50", 1)],
}


def fill(client: redis.Redis, queues: int) -> None:
    """Every queue with a group, 200 entries (100 delivered), 20 dead letters, 20 delayed
    jobs, and an hour of per-minute counters and histograms."""
    minute = int(time.time() // 60)
    for n in range(queues):
        stream = f"jobd:q{n}"
        pipe = client.pipeline(transaction=False)
        for i in range(200):
            pipe.xadd(stream, {"payload": "x" * 200, "job_id": f"job-{n}-{i}"})
        for i in range(20):
            pipe.xadd(f"{{{stream}}}:dead", {"jobd_job_id": f"dead-{i}", "jobd_error": "exit",
                      "jobd_failed_at": "1795960000000", "jobd_stderr": "boom\n" * 50})  # fmt: skip
        for m in range(minute - 59, minute + 1):
            pipe.hset(f"{{{stream}}}:stats:{m}", mapping={"done": 30, "failed": 1})
            pipe.hset(f"{{{stream}}}:timings:{m}", mapping={"run:7": 20, "run:9": 10, "wait:3": 30})
        pipe.execute()
        client.xgroup_create(stream, "jobd", id="0")
        client.xreadgroup("jobd", "bench-1-abcd", {stream: ">"}, count=100)


def cpu_ms(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / TICK


def redis_cpu_ms(client: redis.Redis) -> float:
    info = client.info("cpu")
    return (float(info["used_cpu_sys"]) + float(info["used_cpu_user"])) * 1000


def measure(url: str, pid: int, client: redis.Redis, kind: str, seconds: float) -> dict[str, float]:
    """Send one refresh's requests of ``kind`` back to back for ``seconds``."""
    refreshes, requests = 0, 0
    cpu0, redis0, start = cpu_ms(pid), redis_cpu_ms(client), time.monotonic()
    while time.monotonic() - start < seconds:
        for path, times in KINDS[kind]:
            for _ in range(times):
                with urllib.request.urlopen(url + path, timeout=30) as reply:
                    reply.read()
                requests += 1
        refreshes += 1
    took = time.monotonic() - start
    return {
        "rps": requests / took,
        "server_ms": (cpu_ms(pid) - cpu0) / refreshes,
        "redis_ms": (redis_cpu_ms(client) - redis0) / refreshes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        server, port = start_redis(workdir)
        client = redis.Redis(port=port)
        config = workdir / "jobd.yaml"
        config.write_text(f"redis: {{url: 'redis://127.0.0.1:{port}/0'}}\nqueues:\n" + "".join(
            f"  q{n}: {{command: [/bin/true]}}\n" for n in range(args.queues)))  # fmt: skip
        fill(client, args.queues)
        listen = free_port()
        page = subprocess.Popen(
            [sys.executable, "-m", "jobd", "dashboard", "-c", str(config),
             "--listen", f"127.0.0.1:{listen}"], stdout=subprocess.DEVNULL,
        )  # fmt: skip
        url = f"http://127.0.0.1:{listen}"
        try:
            wait_until(lambda: _answers(url), "the dashboard to answer", 60)
            report(url, page.pid, client, args)
        finally:
            page.terminate()
            page.wait(10)
            server.terminate()
            server.wait(10)


def report(url: str, pid: int, client: redis.Redis, args: argparse.Namespace) -> None:
    results: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    for n in range(args.rounds):
        kinds = list(KINDS) if n % 2 == 0 else list(reversed(KINDS))
        for kind in kinds:
            results[kind].append(got := measure(url, pid, client, kind, args.seconds))
            print(
                f"round {n + 1} {kind:9} {got['rps']:7.1f} requests/s  per refresh: server "
                f"{got['server_ms']:7.1f} ms CPU, Redis {got['redis_ms']:6.1f} ms CPU"
            )
    base = {k: statistics.median(r[k] for r in results["old"]) for k in ("server_ms", "redis_ms")}
    print(f"\n{args.queues} queues, medians of {args.rounds} rounds, one refresh = 5 s of a page:")
    for kind, rows in results.items():
        med = {k: statistics.median(r[k] for r in rows) for k in ("rps", "server_ms", "redis_ms")}
        print(
            f"{kind:9} {med['rps']:7.1f} requests/s; per refresh server {med['server_ms']:.1f} "
            f"ms CPU ({med['server_ms'] / base['server_ms']:.2f} of old), Redis "
            f"{med['redis_ms']:.1f} ms CPU ({med['redis_ms'] / base['redis_ms']:.2f} of old)"
        )


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url + "/", timeout=1).read()
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


if __name__ == "__main__":
    main()
