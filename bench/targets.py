"""Every performance target, each beside its baseline, in one run.

    python bench/targets.py [--quick]

  throughput /bin/true jobs at concurrency 8 against `xargs -P8`, and Celery and RQ when the
             `bench` extra is installed (bench/spawn.py: 2000 jobs, 7 rounds, median ratio);
  latency    enqueue → handler start on an idle daemon (p50, p90 of 60 jobs), against a bare
             `sh -c` started by Popen (the same handler, environment and clock);
  sleepers   1000 `sleep` handlers over two queues: the daemon's RSS, its CPU while they sleep,
             and lease renewal's commands per queue per tick (XCLAIM calls, from the server);
  backlog    100 000 jobs waiting: the daemon's RSS before and after they were added;
  processes  `processes: 1` against `processes: 2`, each against xargs (7 rounds, alternating),
             the CPU a job costs (jobd's processes, the handler), and what 16 cores could run.
--quick runs small sizes, with a fifth of the pauses before a measure (a smoke test of the bench
itself, not a measurement).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spawn import Jobd, start_redis, throughput, xargs_rate

from jobd.process.environment import base_environment

STAMP = 'echo "$JOBD_JOB_ID $(date +%s.%N)" >> {out}'


class Daemon:
    def __init__(self, workdir: Path, port: int, queues: str) -> None:
        self.config = workdir / f"jobd-{time.monotonic_ns()}.yaml"
        self.config.write_text(
            f"redis: {{url: 'redis://127.0.0.1:{port}/0'}}\nshutdown_grace: 1s\nqueues:\n{queues}"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jobd", "run", str(self.config), "--log-level", "WARNING"],
            stderr=subprocess.DEVNULL,
        )
        self.ps = psutil.Process(self.proc.pid)

    def rss_mb(self) -> float:
        return self.ps.memory_info().rss / 2**20

    def cpu(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def wait_for(predicate, timeout: float = 120) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise SystemExit("bench: timed out")
        time.sleep(0.01)


def group_ready(r: redis.Redis, stream: str) -> bool:
    try:
        return bool(r.xinfo_groups(stream))
    except redis.ResponseError:
        return False


def latency(r: redis.Redis, workdir: Path, port: int, samples: int) -> None:
    out = workdir / "stamps"
    d = Daemon(
        workdir, port, f"  lat: {{command: [sh, -c, '{STAMP.format(out=out)}'], concurrency: 1}}\n"
    )
    try:
        wait_for(lambda: group_ready(r, "jobd:lat"))
        jobd_ms = []
        for i in range(samples):
            t0 = time.time()
            r.xadd("jobd:lat", {"payload": "x", "job_id": f"j{i}"})
            wait_for(lambda i=i: out.exists() and f"j{i} " in out.read_text())
            started = float(out.read_text().splitlines()[-1].split()[1])
            jobd_ms.append((started - t0) * 1000)
            time.sleep(0.02)  # idle between jobs: the daemon is blocked in its read again
        bare_ms = []
        # The environment a jobd handler gets here (its PATH decides how far sh looks for date).
        handler_env = base_environment(os.environ)
        for i in range(samples):
            t0 = time.time()
            subprocess.Popen(
                ["sh", "-c", STAMP.format(out=out)], env={**handler_env, "JOBD_JOB_ID": f"b{i}"}
            ).wait()
            started = float(out.read_text().splitlines()[-1].split()[1])
            bare_ms.append((started - t0) * 1000)
    finally:
        d.stop()
    j50, b50 = statistics.median(jobd_ms), statistics.median(bare_ms)
    j90 = statistics.quantiles(jobd_ms, n=10)[-1]
    verdict = "met" if j50 <= b50 + 2 else "NOT met"
    print(
        f"latency   enqueue→start p50 {j50:.2f} ms (p90 {j90:.2f}); bare sh -c start p50 "
        f"{b50:.2f} ms; difference {j50 - b50:+.2f} ms (target ≤ +2 ms: {verdict})"
    )


def sleepers(
    r: redis.Redis, workdir: Path, port: int, count: int, window: float, settle: float
) -> None:
    half = count // 2
    lease = "lease: {renew_every: 1s, reclaim_after: 10s}"
    queues = "".join(
        f"  {q}: {{command: [sleep, '120'], concurrency: {half}, timeout: 5m, {lease}}}\n"
        for q in ("s1", "s2")
    )
    d = Daemon(workdir, port, queues)
    try:
        wait_for(lambda: group_ready(r, "jobd:s1") and group_ready(r, "jobd:s2"))
        idle_rss = d.rss_mb()
        pipe = r.pipeline(transaction=False)
        for i in range(count):
            pipe.xadd("jobd:s1" if i % 2 else "jobd:s2", {"payload": "x"})
        pipe.execute()
        wait_for(
            lambda: (
                sum(g["pending"] for s in ("jobd:s1", "jobd:s2") for g in r.xinfo_groups(s))
                == count
            )
        )
        wait_for(lambda: len(d.ps.children()) == count)
        time.sleep(1.5 * settle)  # let the start-up settle before measuring a quiet window
        calls0 = r.info("commandstats").get("cmdstat_xclaim", {}).get("calls", 0)
        cpu0, t0 = d.cpu(), time.monotonic()
        time.sleep(window)
        cpu = (d.cpu() - cpu0) / (time.monotonic() - t0) * 100
        calls = r.info("commandstats").get("cmdstat_xclaim", {}).get("calls", 0) - calls0
        rss = d.rss_mb()
    finally:
        d.stop()  # its handlers get SIGTERM after shutdown_grace
    per_tick = calls / (2 * window)  # two queues, one tick a second each
    rss_ok, cpu_ok = "met" if rss <= 150 else "NOT met", "met" if cpu <= 2 else "NOT met"
    print(
        f"sleepers  {count} sleeping handlers: RSS {rss:.0f} MB (idle {idle_rss:.0f} MB; "
        f"target ≤ 150: {rss_ok}), CPU {cpu:.2f} % of a core (target ≤ 2: {cpu_ok}), "
        f"renewal {per_tick:.2f} XCLAIM per queue per tick "
        f"(target 1: {'met' if round(per_tick) == 1 else 'NOT met'})"
    )


def backlog(r: redis.Redis, workdir: Path, port: int, count: int, settle: float) -> None:
    d = Daemon(workdir, port, "  slow: {command: [sleep, '60'], concurrency: 8, timeout: 5m}\n")
    try:
        wait_for(lambda: group_ready(r, "jobd:slow"))
        r.xadd("jobd:slow", {"payload": "first"})
        time.sleep(1.0 * settle)
        before = d.rss_mb()
        pipe = r.pipeline(transaction=False)
        for i in range(count):
            pipe.xadd("jobd:slow", {"payload": f"job {i} " + "x" * 100})
            if i % 10_000 == 9_999:
                pipe.execute()
        pipe.execute()
        wait_for(lambda: len(d.ps.children()) == 8)
        time.sleep(2.0 * settle)
        after = d.rss_mb()
        delivered = r.xinfo_groups("jobd:slow")[0]["entries-read"]
    finally:
        d.stop()
    grown = after - before
    flat = "met" if grown < 2 and delivered <= 9 else "NOT met"
    print(
        f"backlog   {count} jobs waiting: RSS {before:.1f} → {after:.1f} MB ({grown:+.1f} MB), "
        f"{delivered} entries read of {count + 1} (flat: {flat})"
    )


def processes(workdir: Path, port: int, jobs: int, rounds: int) -> None:
    """``processes: 1`` against ``processes: 2`` on this machine, each against xargs around it,
    alternating which goes first; then what a job costs in CPU (jobd's own processes, and the
    handlers they reaped) and, from that, what 16 cores could run."""
    one = Jobd(workdir, port, 8, queue="p1")
    two = Jobd(workdir, port, 8, queue="p2", processes=2)
    ratios: dict[int, list[float]] = {1: [], 2: []}
    costs: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
    try:
        for n in range(rounds):
            for count, jobd in ((1, one), (2, two)) if n % 2 == 0 else ((2, two), (1, one)):
                before = xargs_rate(jobs, 8)
                cpu0 = jobd.cpu()
                rate = jobd.rate(jobs)
                cpu1 = jobd.cpu()
                after = xargs_rate(jobs, 8)
                ratios[count].append(rate / ((before + after) / 2))
                costs[count].append(((cpu1[0] - cpu0[0]) / jobs, (cpu1[1] - cpu0[1]) / jobs))
    finally:
        one.stop()
        two.stop()
    for count in (1, 2):
        own = statistics.median(c[0] for c in costs[count]) * 1000
        handler = statistics.median(c[1] for c in costs[count]) * 1000
        print(
            f"processes {count}: median ratio to xargs {statistics.median(ratios[count]):.2f} "
            f"({min(ratios[count]):.2f}–{max(ratios[count]):.2f}); CPU a job: jobd {own:.3f} ms, "
            f"the handler {handler:.3f} ms"
        )
    own = statistics.median(c[0] for c in costs[1])
    handler = statistics.median(c[1] for c in costs[1])
    verdict = (
        "met"
        if statistics.median(ratios[2]) >= statistics.median(ratios[1]) * 0.97
        else ("NOT met")
    )
    print(
        f"processes 2 against 1: {statistics.median(ratios[2]) / statistics.median(ratios[1]):.2f}"
        f" (target: no worse, within 3 %: {verdict}); on paper, 16 cores: one daemon's loop tops "
        f"out at {1 / own:.0f} jobs/s, 16 processes' at {16 / own:.0f}, the spawning itself at "
        f"{16 / (own + handler):.0f} (16 cores / the CPU a job costs all told)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    settle = 0.2 if args.quick else 1.0  # pauses before a measure: a smoke test's are short
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        server, port = start_redis(workdir)
        r = redis.Redis(port=port)
        try:
            ratios = throughput(
                workdir, port, 60 if args.quick else 2000, 1 if args.quick else 7, 8
            )
            met = "met" if ratios["jobd"] >= 0.95 else "NOT met"
            print(f"throughput jobd/xargs median ratio {ratios['jobd']:.2f} (target ≥ 0.95: {met})")
            r.flushall()
            latency(r, workdir, port, 10 if args.quick else 60)
            r.flushall()
            sleepers(r, workdir, port, 20 if args.quick else 1000, 2 if args.quick else 10, settle)
            r.flushall()
            backlog(r, workdir, port, 1000 if args.quick else 100_000, settle)
            r.flushall()
            processes(workdir, port, 60 if args.quick else 2000, 2 if args.quick else 7)
        finally:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()
