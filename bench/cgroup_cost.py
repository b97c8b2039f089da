"""What a cgroup of its own costs each handler (``jobd/process/cgroup.py``), beside none.

    python bench/cgroup_cost.py [--jobs 400] [--rounds 5] [--threads 8]

Starts and reaps ``/bin/true`` handlers one after the other through ``Handler.spawn`` and
``Handler.reap``, as the daemon's loop does, alternating rounds without a cgroup tree and with one
(made under this machine's cgroup v2 mount and removed afterwards): with one, each handler's
cgroup is made, the daemon moves into it for the spawn and back, and at the end the cgroup is
killed, read (cpu.stat, memory.events) and removed. ``--threads`` idle threads stand for the
daemon's (the reader, recorder, ticker, metrics...): moving a process moves every thread of it.
Prints the wall and CPU time per job of each, their medians, and the ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from jobd.config import load
from jobd.job import Job
from jobd.process import cgroup, where
from jobd.process.handler import Handler


def run(queue, tree: cgroup.Tree | None, jobs: int) -> tuple[float, float]:
    """Seconds of wall and of this process's CPU per job."""
    here = os.getcwd()
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(jobs):
        handler = Handler.spawn(Job("q", f"{i}-0", {b"payload": b""}, str(i), 1), queue, here, tree)
        os.waitid(os.P_PID, handler.pid, os.WEXITED | os.WNOWAIT)
        handler.exited(handler.reap())
    if tree is not None:
        while tree.ending:
            tree.tidy()
    return (time.perf_counter() - wall) / jobs, (time.process_time() - cpu) / jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    mount = where.mount_point()
    if mount is None:
        sys.exit("no cgroup v2 hierarchy mounted")
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "c.yaml"
        config.write_text("queues:\n  q:\n    command: [/bin/true]\n")
        queue = load(str(config)).queues["q"]
        found = where.find(os.path.join(mount, f"jobd-bench-{uuid.uuid4().hex[:8]}"))
        assert isinstance(found, where.Found), found
        tree = cgroup.Tree.take(found)
        stop = threading.Event()
        for _ in range(args.threads):
            threading.Thread(target=stop.wait, daemon=True).start()
        results: dict[str, list[tuple[float, float]]] = {"none": [], "cgroup": []}
        try:
            run(queue, None, 50)  # warm up
            for _ in range(args.rounds):
                results["none"].append(run(queue, None, args.jobs))
                results["cgroup"].append(run(queue, tree, args.jobs))
        finally:
            stop.set()
            os.close(tree.home_procs)
            os.rmdir(found.root)
    for name, rows in results.items():
        walls = [w * 1e6 for w, _ in rows]
        cpus = [c * 1e6 for _, c in rows]
        print(f"{name:>6}: wall {statistics.median(walls):6.0f} µs/job "
              f"({min(walls):.0f}–{max(walls):.0f}), daemon CPU {statistics.median(cpus):6.0f} "
              f"µs/job")  # fmt: skip
    base = statistics.median(w for w, _ in results["none"])
    with_cgroup = statistics.median(w for w, _ in results["cgroup"])
    print(f"jobs/s with a cgroup each / without: {base / with_cgroup:.2f}")


if __name__ == "__main__":
    main()
