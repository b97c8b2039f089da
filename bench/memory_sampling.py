"""What sampling ``resources.memory`` costs with N handlers running (``jobd/process/memory.py``).

    python bench/memory_sampling.py [--handlers 1000] [--samples 20]

Starts N ``sleep`` processes, each in a process group of its own as a handler would be, then
times ``memory.over`` on all of them (one read of every process's ``/proc/PID/stat`` on the host,
and a walk of each tree) ``--samples`` times; prints the median ms per sample, the processes on
the host, and what that costs at one sample every ``memory.SAMPLE_EVERY`` seconds, as a share of
one core. The same with no capped handler is free: a daemon whose queues set no memory cap never
samples.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from jobd.process import memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--handlers", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=20)
    args = parser.parse_args()
    sleepers = [subprocess.Popen(["sleep", "600"], process_group=0) for _ in range(args.handlers)]
    try:
        capped = [(p.pid, 1 << 40, []) for p in sleepers]
        times = []
        for _ in range(args.samples):
            start = time.perf_counter()
            assert memory.over(capped) == []
            times.append(time.perf_counter() - start)
        on_host = sum(1 for name in os.listdir("/proc") if name.isdigit())
    finally:
        for p in sleepers:
            p.kill()
        for p in sleepers:
            p.wait()
    ms = statistics.median(times) * 1000
    share = ms / 1000 / memory.SAMPLE_EVERY * 100
    print(f"{args.handlers} capped handlers, {on_host} processes on the host: "
          f"{ms:.1f} ms a sample (median of {args.samples}); at one sample every "
          f"{memory.SAMPLE_EVERY:g}s: {share:.1f} % of one core")  # fmt: skip


if __name__ == "__main__":
    main()
