"""No-op jobs against the process-spawn limit, side by side in one run.

    python bench/spawn.py [--jobs 2000] [--rounds 3] [--concurrency 8]

Each round measures, alternately:
  xargs  `seq N | xargs -P8 -n1 /bin/true`: what this machine can spawn, the baseline;
  jobd   a running daemon with /bin/true handlers at concurrency 8, from the first XADD of N
         jobs (pipelined) to the last of them acknowledged.
It prints jobs/s for each and the ratio jobd/xargs per round, then the median ratio.
Needs redis-server (or valkey-server) on PATH; it starts its own on a free loopback port.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

WARM_UP = 500  # jobs run before the first measured round


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    binary = shutil.which("redis-server") or shutil.which("valkey-server")
    if not binary:
        sys.exit("bench: needs redis-server or valkey-server on PATH")
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
        ],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    for _ in range(500):
        try:
            client.ping()
            return proc, port
        except redis.ConnectionError:
            time.sleep(0.01)
    sys.exit("bench: redis-server did not start")


def xargs_rate(jobs: int, concurrency: int) -> float:
    start = time.perf_counter()
    subprocess.run(f"seq {jobs} | xargs -P{concurrency} -n1 /bin/true", shell=True, check=True)
    return jobs / (time.perf_counter() - start)


def jobd_rate(client: redis.Redis, stream: str, jobs: int, done_before: int) -> float:
    start = time.perf_counter()
    pipe = client.pipeline(transaction=False)
    for i in range(jobs):
        pipe.xadd(stream, {"payload": str(i)})
    pipe.execute()
    target = done_before + jobs
    while True:
        group = client.xinfo_groups(stream)[0]
        if group["entries-read"] == target and group["pending"] == 0:
            return jobs / (time.perf_counter() - start)
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        server, port = start_redis(workdir)
        config = workdir / "bench.yaml"
        config.write_text(
            f"redis: {{url: 'redis://127.0.0.1:{port}/0'}}\n"
            f"queues:\n  noop: {{command: [/bin/true], concurrency: {args.concurrency}}}\n"
        )
        log = open(workdir / "jobd.log", "wb")  # noqa: SIM115
        daemon = subprocess.Popen(
            [sys.executable, "-m", "jobd", "run", str(config), "--log-level", args.log_level],
            stderr=log,
        )
        client = redis.Redis(port=port)
        try:
            while not client.exists("jobd:noop"):
                time.sleep(0.01)
            jobd_rate(client, "jobd:noop", WARM_UP, 0)  # warm up
            done = WARM_UP
            ratios = []
            print(f"{'round':>5} {'xargs jobs/s':>13} {'jobd jobs/s':>12} {'ratio':>6}")
            for n in range(1, args.rounds + 1):
                base = xargs_rate(args.jobs, args.concurrency)
                ours = jobd_rate(client, "jobd:noop", args.jobs, done)
                done += args.jobs
                ratios.append(ours / base)
                print(f"{n:>5} {base:>13.0f} {ours:>12.0f} {ours / base:>6.2f}")
            print(
                f"median ratio jobd/xargs: {statistics.median(ratios):.2f} "
                f"({args.jobs} jobs, concurrency {args.concurrency}, {os.cpu_count()} cores)"
            )
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(30)
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()
