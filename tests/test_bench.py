"""Smoke tests of the benchmarks: they run, on small sizes, and report what they promise.
(Speed itself is measured by running them, never by a timed test.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def run(*args: str) -> str:
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_spawn_bench_runs() -> None:
    out = run(str(BENCH / "spawn.py"), "--jobs", "60", "--rounds", "1")
    assert "median ratio to xargs: jobd " in out


def test_renewal_bench_runs() -> None:
    out = run(str(BENCH / "renewal.py"), "--in-flight", "50", "--repeat", "3")
    assert "jobd (renew.lua)" in out and "(delivery counts after: {1})" in out


def test_targets_bench_runs() -> None:
    out = run(str(BENCH / "targets.py"), "--quick")
    for line in ("throughput", "latency", "sleepers", "backlog"):
        assert out.count(f"{line} ") >= 1, out


def test_compare_bench_runs() -> None:
    tree = str(BENCH.parent)
    out = run(str(BENCH / "compare.py"), tree, tree, "--jobs", "60", "--rounds", "2")
    assert "new/old, median of the rounds:" in out and "old: median" in out


def test_enqueue_bench_runs() -> None:
    out = run(str(BENCH / "enqueue.py"), "--quick")
    assert "median ratio jobd/raw: " in out and out.count("\nround ") == 2, out


def test_startup_bench_runs() -> None:
    out = run(str(BENCH / "startup.py"), "--runs", "1")
    assert out.count("× the interpreter") == 7 and "jobd run (to running)" in out, out


def test_settle_cost_bench_runs() -> None:
    tree = str(BENCH.parent)
    out = run(str(BENCH / "settle_cost.py"), tree, tree, "--calls", "5", "--batch", "10",
              "--rounds", "1")  # fmt: skip
    assert "new - old: Redis " in out and "old: Redis " in out, out


def test_follow_ups_cost_bench_runs() -> None:
    out = run(str(BENCH / "follow_ups_cost.py"), "--quick", "--repeat", "1")
    assert out.count("ms of Redis, weight ") == 9, out


def test_memory_sampling_bench_runs() -> None:
    out = run(str(BENCH / "memory_sampling.py"), "--handlers", "20", "--samples", "3")
    assert "20 capped handlers, " in out and "% of one core" in out, out


def test_loop_model_bench_runs() -> None:
    out = run(str(BENCH / "loop_model.py"), "--jobs", "40", "--rounds", "1", "--side-us", "20",
              "--modes", "vfork,forkserver,sync,thread")  # fmt: skip
    assert "vfork: median ratio to xargs " in out and "thread/vfork, median" in out, out
    # The fork server is built where a C compiler is found (this project's build machine has
    # one); without one the model says so and measures the daemon's own spawn alone.
    assert "forkserver/vfork, median of the rounds: " in out or "no C compiler found" in out, out


def test_notify_flood_bench_runs() -> None:
    out = run(str(BENCH / "notify_flood.py"), "--jobs", "60", "--rounds", "1", "--rate", "2000")
    assert "flooded/quiet, median of the rounds: " in out and "msgs/s" in out, out


def test_dashboard_cost_bench_runs() -> None:
    out = run(
        str(BENCH / "dashboard_cost.py"), "--queues", "3", "--seconds", "0.5", "--rounds", "1"
    )
    assert "3 queues, medians of 1 rounds" in out and "of old)" in out, out
