"""How long the day-one commands take to start, beside the interpreter's own start.

    python bench/startup.py [--runs 15]

Each run times, in an order that rotates from run to run, a new process from its start to its
exit: the baseline ``python -c pass`` (the interpreter alone), ``python -c "import redis"``
(the client every command that talks to Redis needs), ``jobd --help``, ``jobd enqueue`` of one
job and ``jobd status``, the last two against a private Redis and a one-queue config. Prints
each one's median ms and its ratio to the baseline. As on an installed system, the bytecode is
cached: each command runs once untimed first, with PYTHONDONTWRITEBYTECODE dropped (set, every
module is compiled at every start: about 0.1 s more a command). Needs redis-server (or
valkey-server) on PATH; it starts its own on a free loopback port.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spawn import start_redis


def commands(config: Path) -> dict[str, list[str]]:
    jobd = [sys.executable, "-m", "jobd"]
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "python -c 'import redis'": [sys.executable, "-c", "import redis"],
        "jobd --help": [*jobd, "--help"],
        "jobd enqueue": [*jobd, "enqueue", "-c", str(config), "q", "payload"],
        "jobd status": [*jobd, "status", "-c", str(config)],
    }


ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(command: list[str]) -> float:
    """Seconds from the process's start to its exit (it must exit 0)."""
    start = time.perf_counter()
    subprocess.run(
        command, check=True, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        proc, port = start_redis(Path(work))
        try:
            config = Path(work) / "jobd.yaml"
            config.write_text(
                f"redis: {{url: 'redis://127.0.0.1:{port}/0'}}\n"
                "queues:\n  q: {command: [/bin/true]}\n"
            )
            named = commands(config)
            times: dict[str, list[float]] = {name: [] for name in named}
            order = list(named)
            for name in order:  # untimed: the bytecode written, the page cache warm
                timed(named[name])
            for run in range(args.runs):
                for name in order[run % len(order) :] + order[: run % len(order)]:
                    times[name].append(timed(named[name]))
        finally:
            proc.terminate()
            proc.wait()
    base = statistics.median(times["python -c pass"])
    for name, seen in times.items():
        median = statistics.median(seen)
        print(f"{name:28} {median * 1000:7.1f} ms  {median / base:5.1f} × the interpreter")


if __name__ == "__main__":
    main()
