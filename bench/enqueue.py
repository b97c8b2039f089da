"""Bulk enqueue against raw pipelined XADD, side by side in one run.

    python bench/enqueue.py [--jobs 100000] [--rounds 5] [--batch 1000] [--quick]

Each round measures, in an order that alternates from round to round (so that the machine
getting faster or slower counts against neither):
  raw    the baseline, redis-benchmark style: a tight redis-py loop of XADD ``payload`` P,
         ``--batch`` to a pipeline, N payloads held in memory;
  jobd   `jobd enqueue -c CONFIG QUEUE --lines FILE` of the same N payloads, one a line, as
         an operator runs it: a new process, from its start to its exit (interpreter start,
         config and imports included); its own summary's rate (after start-up) is shown too.
The stream is deleted after each measurement, so every run writes into an empty one. It
prints jobs/s per round, the medians, and the ratio jobd/raw (median of the rounds' ratios).
Needs redis-server (or valkey-server) on PATH; it starts its own on a free loopback port.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spawn import start_redis

TARGET = 20_000  # jobs/s from one process into a local Redis (issue 19)
STREAM = "jobd:bulk"


def payloads(jobs: int) -> list[bytes]:
    """N distinct payloads of the size of a small job (about 40 bytes)."""
    return [b'{"order": %d, "action": "thumbnail"}' % i for i in range(jobs)]


def raw_rate(client: redis.Redis, data: list[bytes], batch: int) -> float:
    """XADD every payload, ``batch`` to a pipeline: what Redis and redis-py can do."""
    start = time.perf_counter()
    for i in range(0, len(data), batch):
        pipe = client.pipeline(transaction=False)
        for payload in data[i : i + batch]:
            pipe.xadd(STREAM, {b"payload": payload})
        pipe.execute()
    return len(data) / (time.perf_counter() - start)


def jobd_rate(config: Path, lines: Path, jobs: int, batch: int) -> tuple[float, float]:
    """`jobd enqueue --lines`: (jobs/s over the whole process, jobs/s its summary says)."""
    command = [sys.executable, "-m", "jobd", "enqueue", "-c", str(config), "bulk",
               "--lines", str(lines), "--chunk", str(batch)]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0 or f"jobd: {jobs} enqueued, 0 refused" not in done.stderr:
        sys.exit(f"bench: jobd enqueue failed ({done.returncode}): {done.stderr}")
    own = re.search(r"\(([\d,]+) jobs/s\)", done.stderr)
    return jobs / elapsed, float(own.group(1).replace(",", "")) if own else 0.0


def measure(
    client: redis.Redis, config: Path, lines: Path, data: list[bytes], batch: int, first: str
) -> dict[str, float]:
    """One round: both, ``first`` first; the stream checked and emptied after each."""
    rates: dict[str, float] = {}
    for name in (first, "jobd" if first == "raw" else "raw"):
        if name == "raw":
            rates["raw"] = raw_rate(client, data, batch)
        else:
            rates["jobd"], rates["jobd_own"] = jobd_rate(config, lines, len(data), batch)
        written = client.xlen(STREAM)
        if written != len(data):
            sys.exit(f"bench: {name} wrote {written} entries, not {len(data)}")
        client.delete(STREAM)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="a small run: the smoke test's")
    args = parser.parse_args()
    jobs, rounds = (2000, 2) if args.quick else (args.jobs, args.rounds)
    with tempfile.TemporaryDirectory(prefix="jobd-bench-enqueue-") as tmp:
        workdir = Path(tmp)
        server, port = start_redis(workdir)
        try:
            config = workdir / "bulk.yaml"
            config.write_text(
                f"redis: {{url: 'redis://127.0.0.1:{port}/0'}}\n"
                "queues:\n  bulk: {command: [/bin/true]}\n"
            )
            data = payloads(jobs)
            lines = workdir / "jobs.txt"
            lines.write_bytes(b"".join(p + b"\n" for p in data))
            client = redis.Redis(port=port)
            report(
                [
                    measure(client, config, lines, data, args.batch, "raw" if n % 2 else "jobd")
                    for n in range(rounds)
                ],
                jobs,
                args.batch,
            )
        finally:
            server.terminate()
            server.wait()


def report(results: list[dict[str, float]], jobs: int, batch: int) -> None:
    print(f"{jobs} jobs a run, {batch} per round trip, {len(results)} rounds")
    for n, r in enumerate(results, 1):
        print(
            f"round {n}: raw XADD {r['raw']:,.0f} jobs/s; jobd enqueue --lines {r['jobd']:,.0f} "
            f"jobs/s (process), {r['jobd_own']:,.0f} (its summary); ratio "
            f"{r['jobd'] / r['raw']:.2f}"
        )
    raw = statistics.median(r["raw"] for r in results)
    whole = statistics.median(r["jobd"] for r in results)
    own = statistics.median(r["jobd_own"] for r in results)
    ratios = [r["jobd"] / r["raw"] for r in results]
    print(f"median: raw XADD {raw:,.0f} jobs/s; jobd {whole:,.0f} jobs/s (process), {own:,.0f}")
    print(
        f"median ratio jobd/raw: {statistics.median(ratios):.2f} "
        f"(rounds {min(ratios):.2f}-{max(ratios):.2f})"
    )
    met = "met" if whole >= TARGET else "NOT met"
    print(f"target >= {TARGET:,} jobs/s from one process: {met}")


if __name__ == "__main__":
    main()
