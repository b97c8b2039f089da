"""How long the day-one commands take to start, beside the interpreter's own start.

    python bench/startup.py [--runs 15]

Each run times, in an order that rotates from run to run, a new process from its start to its
exit: the baseline ``python -c pass`` (the interpreter alone), ``python -c "import redis"``
(the client every command that talks to Redis needs), ``jobd --help``, ``jobd validate``,
``jobd enqueue`` of one job, ``jobd status`` and ``jobd run`` until its start line says it is
running (then SIGKILLed), the last three against a private Redis and a one-queue config. Prints
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
        "jobd validate": [*jobd, "validate", str(config)],
        "jobd enqueue": [*jobd, "enqueue", "-c", str(config), "q", "payload"],
        "jobd status": [*jobd, "status", "-c", str(config)],
        "jobd run (to running)": [*jobd, "run", str(config)],
    }


ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(command: list[str]) -> float:
    """Seconds from the process's start to its exit (it must exit 0); for `jobd run`, to the
    line that says it is running (it is SIGKILLed then)."""
    start = time.perf_counter()
    if "run" in command:
        return time_to_running(command, start)
    subprocess.run(
        command, check=True, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return time.perf_counter() - start


def time_to_running(command: list[str], start: float) -> float:
    daemon = subprocess.Popen(command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert daemon.stdout is not None
    for line in daemon.stdout:
        if b"jobd running as consumer" in line:
            took = time.perf_counter() - start
            daemon.kill()
            daemon.wait()
            return took
    raise RuntimeError(f"jobd run exited with {daemon.wait()} before it was running")


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
