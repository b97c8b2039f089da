"""No-op jobs against the process-spawn limit, side by side in one run.

    python bench/spawn.py [--jobs 2000] [--rounds 7] [--concurrency 8] [--skip celery|rq]

Each round measures, one after the other:
  xargs   `seq N | xargs -P8 -n1 /bin/true`: what this machine can spawn, the baseline;
  jobd    a running daemon with /bin/true handlers at concurrency 8, from the first XADD of N
          jobs (pipelined) to the last of them acknowledged;
  xargs   again: jobd's baseline is the mean of the two runs around it, so that the machine
          getting faster or slower during a round (it does, by up to 20 % on a shared 2-core
          VM) counts against neither;
  celery  (with the `bench` extra) a Celery prefork worker, -c 8, whose task runs /bin/true;
  rq      (with the `bench` extra) eight RQ workers, the same task (both against the second
          xargs run);
each from enqueueing N jobs to all done. It prints jobs/s per round and each one's ratio to
its xargs baseline, then the medians of those ratios and their spread.
Needs redis-server (or valkey-server) on PATH; it starts its own on a free loopback port, and
Celery and RQ use it as their broker.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import psutil
import redis

WARM_UP = 500  # jobs run by each system before the first measured round
POLL = 0.01  # how often completion is checked: seldom enough to take little of the CPU

# The task Celery and RQ run: what a jobd handler of /bin/true does, and a count of it.
TASKS = """
import os
import subprocess

import redis

done = redis.Redis(port=int(os.environ["BENCH_REDIS_PORT"]))


def true() -> None:
    subprocess.run(["/bin/true"], check=True)
    done.incr("bench:done")


if os.environ.get("BENCH_CELERY"):
    from celery import Celery

    app = Celery("benchtasks", broker=f"redis://127.0.0.1:{os.environ['BENCH_REDIS_PORT']}/1")
    app.conf.update(task_ignore_result=True, worker_hijack_root_logger=False)
    celery_true = app.task(name="true")(true)
"""


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
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
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


def wait_until(done: Callable[[], bool], what: str, timeout: float = 600) -> None:
    end = time.monotonic() + timeout
    while not done():
        if time.monotonic() > end:
            sys.exit(f"bench: timed out waiting for {what}")
        time.sleep(POLL)


class System(Protocol):
    name: str

    def rate(self, jobs: int) -> float: ...

    def stop(self) -> None: ...


class Jobd:
    """A daemon with /bin/true handlers on queue ``name``; ``tree``: run that checkout's code
    (its folder is the working folder, so `python -m jobd` imports it) instead of this one."""

    name = "jobd"

    def __init__(
        self, workdir: Path, port: int, concurrency: int, log_level: str = "INFO",
        queue: str = "noop", tree: Path | None = None, processes: int = 1,
    ) -> None:  # fmt: skip
        self.stream = f"jobd:{queue}"
        config = workdir / f"{queue}.yaml"
        config.write_text(
            f"redis: {{url: 'redis://127.0.0.1:{port}/0'}}\n"
            + (f"processes: {processes}\n" if processes != 1 else "")
            + f"queues:\n  {queue}: {{command: [/bin/true], concurrency: {concurrency}}}\n"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jobd", "run", str(config), "--log-level", log_level],
            cwd=tree,
            env=dict(os.environ, PYTHONPATH=str(tree)) if tree else None,
            stderr=open(workdir / f"{queue}.log", "wb"),  # noqa: SIM115
        )
        self.client = redis.Redis(port=port)
        self.done = 0
        wait_until(lambda: self.client.exists(self.stream), f"{queue}'s consumer group")
        self.rate(WARM_UP)

    def rate(self, jobs: int) -> float:
        start = time.perf_counter()
        pipe = self.client.pipeline(transaction=False)
        for i in range(jobs):
            pipe.xadd(self.stream, {"payload": str(i)})
        pipe.execute()
        self.done += jobs

        def all_acked() -> bool:
            group = self.client.xinfo_groups(self.stream)[0]
            return group["entries-read"] == self.done and group["pending"] == 0

        wait_until(all_acked, f"{self.stream}'s jobs")
        return jobs / (time.perf_counter() - start)

    def cpu(self) -> tuple[float, float]:
        """CPU seconds so far of jobd's own processes (the daemon, or the supervisor and its
        daemons), and of the handlers they reaped."""
        own = handlers = 0.0
        top = psutil.Process(self.proc.pid)
        for p in [top, *top.children()]:
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            if p.pid == top.pid or "jobd" in " ".join(p.cmdline()):
                own += t.user + t.system
                handlers += t.children_user + t.children_system
        return own, handlers

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)


class Counted:
    """Celery or RQ: workers whose task (benchtasks.py, written here) counts itself in
    `bench:done`."""

    name = ""

    def __init__(self, workdir: Path, port: int, concurrency: int) -> None:
        (workdir / "benchtasks.py").write_text(TASKS)
        self.client = redis.Redis(port=port)
        self.connect(workdir, port)
        env = dict(os.environ, BENCH_REDIS_PORT=str(port), PYTHONPATH=str(workdir))
        env.update(BENCH_CELERY="1" if self.name == "celery" else "")
        self.procs = [
            subprocess.Popen(argv, cwd=workdir, env=env, stdout=subprocess.DEVNULL,
                             stderr=open(workdir / f"{self.name}.log", "ab"))  # noqa: SIM115
            for argv in self.workers(port, concurrency)
        ]  # fmt: skip
        self.rate(WARM_UP // 5)

    def connect(self, workdir: Path, port: int) -> None:
        """Get ready to enqueue from this process."""
        raise NotImplementedError

    def workers(self, port: int, concurrency: int) -> list[list[str]]:
        """The worker processes' command lines."""
        raise NotImplementedError

    def enqueue(self, jobs: int) -> None:
        raise NotImplementedError

    def rate(self, jobs: int) -> float:
        self.client.set("bench:done", 0)
        start = time.perf_counter()
        self.enqueue(jobs)
        wait_until(lambda: int(self.client.get("bench:done") or 0) >= jobs, f"{self.name} jobs")
        return jobs / (time.perf_counter() - start)

    def stop(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


class Celery(Counted):
    name = "celery"

    def connect(self, workdir: Path, port: int) -> None:
        os.environ.update(BENCH_REDIS_PORT=str(port), BENCH_CELERY="1")
        sys.path.insert(0, str(workdir))
        import benchtasks  # type: ignore[import-not-found]

        self.task = benchtasks.celery_true

    def workers(self, port: int, concurrency: int) -> list[list[str]]:
        return [
            [sys.executable, "-m", "celery", "-A", "benchtasks", "worker", "-P", "prefork",
             "-c", str(concurrency), "-l", "WARNING", "--without-gossip", "--without-mingle",
             "--without-heartbeat"]
        ]  # fmt: skip

    def enqueue(self, jobs: int) -> None:
        with self.task.app.producer_or_acquire() as producer:
            for _ in range(jobs):
                self.task.apply_async(producer=producer)


class Rq(Counted):
    name = "rq"

    def connect(self, workdir: Path, port: int) -> None:
        from rq import Queue

        self.queue = Queue("bench", connection=redis.Redis(port=port, db=2))

    def workers(self, port: int, concurrency: int) -> list[list[str]]:
        url = f"redis://127.0.0.1:{port}/2"
        argv = [sys.executable, "-m", "rq.cli", "worker", "--url", url, "--quiet", "bench"]
        return [argv] * concurrency

    def enqueue(self, jobs: int) -> None:
        from rq import Queue

        data = [Queue.prepare_data("benchtasks.true", result_ttl=0) for _ in range(jobs)]
        self.queue.enqueue_many(data)


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def throughput(
    workdir: Path,
    port: int,
    jobs: int,
    rounds: int,
    concurrency: int,
    log_level: str = "INFO",
    skip: tuple[str, ...] = (),
) -> dict[str, float]:
    """Print the rounds; return each system's median ratio to xargs."""
    systems: list[System] = [Jobd(workdir, port, concurrency, log_level)]
    others = [name for name in ("celery", "rq") if name not in skip]
    missing = [name for name in others if not installed(name)]
    try:
        if "celery" in others and "celery" not in missing:
            systems.append(Celery(workdir, port, concurrency))
        if "rq" in others and "rq" not in missing:
            systems.append(Rq(workdir, port, concurrency))
        jobd, rest = systems[0], systems[1:]
        print(
            f"{'round':>5} {'xargs':>7} {jobd.name:>7} {'xargs':>7} {'ratio':>6}"
            + "".join(f" {s.name:>7} {'ratio':>6}" for s in rest)
        )
        ratios: dict[str, list[float]] = {s.name: [] for s in systems}
        for n in range(1, rounds + 1):
            before = xargs_rate(jobs, concurrency)
            rate = jobd.rate(jobs)
            after = xargs_rate(jobs, concurrency)
            ratio = rate / ((before + after) / 2)
            ratios[jobd.name].append(ratio)
            row = f"{n:>5} {before:>7.0f} {rate:>7.0f} {after:>7.0f} {ratio:>6.2f}"
            for system in rest:
                other = system.rate(jobs)
                ratios[system.name].append(other / after)
                row += f" {other:>7.0f} {other / after:>6.2f}"
            print(row, flush=True)
    finally:
        for system in systems:
            system.stop()
    medians = {name: statistics.median(r) for name, r in ratios.items()}
    print(
        "median ratio to xargs: "
        + ", ".join(
            f"{name} {medians[name]:.2f} ({min(r):.2f}–{max(r):.2f})" for name, r in ratios.items()
        )
        + f" ({jobs} jobs per round, concurrency {concurrency}, {os.cpu_count()} cores)"
        + (f"; not installed: {', '.join(missing)} (pip install '.[bench]')" if missing else "")
    )
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument(
        "--skip", action="append", default=[], choices=["celery", "rq"], help="leave one out"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server, port = start_redis(Path(tmp))
        try:
            throughput(
                Path(tmp), port, args.jobs, args.rounds, args.concurrency, args.log_level,
                tuple(args.skip),
            )  # fmt: skip
        finally:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()
