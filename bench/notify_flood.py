"""What one handler flooding its NOTIFY_SOCKET costs the other jobs of its daemon.

    python bench/notify_flood.py [--jobs 2000] [--rounds 4] [--rate 10000] [--qlen 512]

One daemon, two queues: ``noop`` (/bin/true handlers, concurrency 8) and ``flood`` (one handler
that sends ``--rate`` messages a second, ``X_JOBD_PROGRESS=…`` and ``STATUS=…``, on its channel
until told to stop). Each round measures the noop queue's jobs/s without the flood and with it,
in alternating order, and says how many messages the flooder sent a second meanwhile (its
socket blocks while the daemon's queue is full: what it sent is what the loop took). Prints
each round, the medians and the median of with/without per round: the target is ≥ 0.90.

How many messages the socket's queue holds is the host's ``net.unix.max_dgram_qlen`` (the
kernel's default is 10; systemd sets 512 at boot, on the hosts jobd is made for): ``--qlen N``
runs the bench in a network namespace of its own with that value (root; ``unshare -n``), as on
such a host, whatever this one's is. The value in force is printed first.
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

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spawn import start_redis, wait_until

FLOODER = """\
#!{python}
import os, socket, sys, time
stop, count, rate = sys.argv[1], sys.argv[2], int(sys.argv[3])
address = os.environ["NOTIFY_SOCKET"]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.connect("\\0" + address[1:])
sent, start, burst = 0, time.monotonic(), max(1, rate // 100)
while not os.path.exists(stop):
    for _ in range(burst):
        s.send(b"X_JOBD_PROGRESS=%d\\nSTATUS=working on item %d" % (sent % 100, sent))
        sent += 1
    ahead = start + sent / rate - time.monotonic()
    if ahead > 0:
        time.sleep(ahead)
with open(count, "w") as f:
    f.write(f"{{sent}} {{time.monotonic() - start}}")
"""


class NoopRate:
    """The noop queue's rate (``client``, ``done``: the jobs sent so far), for this bench's
    ``Bench`` and bench/stranger_flood.py's."""

    client: redis.Redis
    done: int

    def noop(self, jobs: int) -> float:
        start = time.perf_counter()
        pipe = self.client.pipeline(transaction=False)
        for i in range(jobs):
            pipe.xadd("jobd:noop", {"payload": str(i)})
        pipe.execute()
        self.done += jobs

        def all_acked() -> bool:
            group = self.client.xinfo_groups("jobd:noop")[0]
            return group["entries-read"] == self.done and group["pending"] == 0

        wait_until(all_acked, "the noop jobs")
        return jobs / (time.perf_counter() - start)


class Bench(NoopRate):
    def __init__(self, workdir: Path, port: int, rate: int) -> None:
        self.workdir, self.rate_asked = workdir, rate
        flooder = workdir / "flood.py"
        flooder.write_text(FLOODER.format(python=sys.executable))
        flooder.chmod(0o755)
        config = workdir / "jobd.yaml"
        config.write_text(
            f"redis: {{url: 'redis://127.0.0.1:{port}/0'}}\nqueues:\n"
            "  noop: {command: [/bin/true], concurrency: 8}\n"
            f"  flood: {{command: [{flooder}, {workdir}/stop, {workdir}/count, '{rate}'], "
            "concurrency: 1, timeout: 1h}\n"
        )
        tree = Path(__file__).resolve().parent.parent
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jobd", "run", str(config), "--log-level", "INFO"],
            cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)),
            stderr=open(workdir / "jobd.log", "wb"),  # noqa: SIM115
        )  # fmt: skip
        self.client = redis.Redis(port=port)
        self.done = 0
        wait_until(lambda: self.client.exists("jobd:noop"), "the noop queue's group")
        self.noop(200)

    def flooded(self, jobs: int) -> tuple[float, float]:
        """The noop rate while the flooder runs, and the flooder's messages a second."""
        stop, count = self.workdir / "stop", self.workdir / "count"
        for path in (stop, count):
            path.unlink(missing_ok=True)
        self.client.xadd("jobd:flood", {"payload": ""})
        wait_until(lambda: self.client.xinfo_groups("jobd:flood")[0]["pending"] == 1, "flood")
        time.sleep(0.5)  # the flood under way
        rate = self.noop(jobs)
        stop.touch()
        wait_until(count.exists, "the flooder's count")
        sent, seconds = count.read_text().split()
        return rate, int(sent) / float(seconds)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def qlen() -> int:
    return int(Path("/proc/sys/net/unix/max_dgram_qlen").read_text())


def in_namespace(value: int) -> None:
    """This bench again, in a network namespace of its own (loopback up) whose
    net.unix.max_dgram_qlen is ``value``."""
    inner = f'sysctl -q -w net.unix.max_dgram_qlen={value} && ip link set lo up && exec "$@"'
    command = [sys.executable, *sys.argv]
    os.execvp("unshare", ["unshare", "-n", "sh", "-c", inner, "sh", *command])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--rate", type=int, default=10000, help="messages a second to send")
    parser.add_argument("--qlen", type=int, help="net.unix.max_dgram_qlen to run with (root)")
    args = parser.parse_args()
    if args.qlen is not None and qlen() != args.qlen:
        in_namespace(args.qlen)
    print(f"net.unix.max_dgram_qlen: {qlen()}")
    quiet: list[float] = []
    loud: list[float] = []
    floods: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        server, port = start_redis(Path(tmp))
        bench = Bench(Path(tmp), port, args.rate)
        try:
            print(f"{'round':>5} {'quiet':>7} {'flooded':>8} {'msgs/s':>8}")
            for n in range(args.rounds):
                for flood in (False, True) if n % 2 == 0 else (True, False):
                    if flood:
                        rate, sent = bench.flooded(args.jobs)
                        loud.append(rate)
                        floods.append(sent)
                    else:
                        quiet.append(bench.noop(args.jobs))
                print(f"{n + 1:>5} {quiet[-1]:>7.0f} {loud[-1]:>8.0f} {floods[-1]:>8.0f}")
        finally:
            bench.stop()
            server.terminate()
            server.wait(10)
    ratio = statistics.median(b / a for a, b in zip(quiet, loud, strict=True))
    loud_rate, flood_rate = statistics.median(loud), statistics.median(floods)
    print(f"quiet: median {statistics.median(quiet):.0f} jobs/s; flooded: median "
          f"{loud_rate:.0f} jobs/s at {flood_rate:.0f} msgs/s")  # fmt: skip
    print(f"flooded/quiet, median of the rounds: {ratio:.3f} (target >= 0.90)")


if __name__ == "__main__":
    main()
