"""What a stranger's flood of the daemon's NOTIFY_SOCKET costs its jobs.

    python bench/stranger_flood.py [--jobs 1000] [--rounds 4] [--senders 4] [--qlen 512]
                                   [--same-uid]

Anyone can find the channel's abstract name in /proc/net/unix and send to it. One daemon (run
as root), one queue ``noop`` (/bin/true handlers, concurrency 4, ``run_as: nobody``); ``--senders``
processes of another user (uid 64000; ``--same-uid``: nobody's, the handlers' own), each in a
session of its own, send to the channel as fast as the socket takes it. Each round measures the
noop queue's jobs/s without the flood and with it, in alternating order. Prints each round, the
medians and the median of flooded/quiet per round. Root (setuid, and ``--qlen``: a network
namespace of its own with that net.unix.max_dgram_qlen, as ``notify_flood.py``).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from notify_flood import NoopRate, in_namespace, qlen
from spawn import start_redis, wait_until

STRANGER = """\
import os, signal, socket, sys
os.setsid()
os.setgid({gid}); os.setuid({uid})
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.connect("\\0" + sys.argv[1])
n = 0
def stop(*_):
    os.write(1, b"%d\\n" % n)
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
while True:
    s.send(b"X_JOBD_PROGRESS=%d\\nSTATUS=not yours %d" % (n % 100, n))
    n += 1
"""


class Bench(NoopRate):
    def __init__(self, workdir: Path, port: int) -> None:
        config = workdir / "jobd.yaml"
        config.write_text(
            f"redis: {{url: 'redis://127.0.0.1:{port}/0'}}\nqueues:\n"
            "  noop: {command: [/bin/true], concurrency: 4, run_as: {user: nobody}}\n"
        )
        tree = Path(__file__).resolve().parent.parent
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jobd", "run", str(config), "--log-level", "WARNING"],
            cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)),
            stderr=open(workdir / "jobd.log", "wb"),  # noqa: SIM115
        )  # fmt: skip
        self.client = redis.Redis(port=port)
        self.done = 0
        wait_until(lambda: self.client.exists("jobd:noop"), "the noop queue's group")
        self.noop(200)
        self.address = self.channel()

    def channel(self) -> str:
        """The daemon's channel, as a stranger finds it: its abstract name in /proc/net/unix."""
        pids = {self.proc.pid, *(c.pid for c in psutil.Process(self.proc.pid).children(True))}
        for line in Path("/proc/net/unix").read_text().splitlines():
            found = re.search(r"@(jobd/(\d+)/[0-9a-f]+)$", line)
            if found and int(found[2]) in pids:
                return found[1]
        sys.exit("bench: the daemon's channel not found in /proc/net/unix")

    def threads(self) -> dict[int, float]:
        """CPU seconds of each of the daemon's threads (the loop's process: the one that
        bound the channel)."""
        pid = int(self.address.split("/")[1])
        return {t.id: t.user_time + t.system_time for t in psutil.Process(pid).threads()}

    def flooded(self, jobs: int, senders: int, uid: int) -> float:
        code = STRANGER.format(uid=uid, gid=uid)
        flood = [subprocess.Popen([sys.executable, "-c", code, self.address],
                                  stdout=subprocess.PIPE) for _ in range(senders)]  # fmt: skip
        try:
            time.sleep(0.5)  # the flood under way
            before, start = self.threads(), time.perf_counter()
            rate = self.noop(jobs)
            after, took = self.threads(), time.perf_counter() - start
        finally:
            for proc in flood:
                proc.terminate()
            sent = sum(int(proc.communicate()[0] or 0) for proc in flood)
        loop = int(self.address.split("/")[1])
        used = sorted(((after[t] - before.get(t, 0)) / took, t == loop) for t in after)[::-1]
        print(
            f"  {sent / (took + 0.5):.0f} msgs/s sent; the daemon's threads, cores:",
            " ".join(f"{u:.2f}{' (loop)' if main else ''}" for u, main in used[:3]),
        )
        return rate

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--qlen", type=int, help="net.unix.max_dgram_qlen to run with (root)")
    parser.add_argument("--same-uid", action="store_true", help="strangers run as the handlers")
    args = parser.parse_args()
    if args.qlen is not None and qlen() != args.qlen:
        in_namespace(args.qlen)
    uid = 65534 if args.same_uid else 64000
    print(f"net.unix.max_dgram_qlen: {qlen()}; {args.senders} strangers of uid {uid}")
    quiet: list[float] = []
    loud: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        server, port = start_redis(Path(tmp))
        bench = Bench(Path(tmp), port)
        try:
            print(f"{'round':>5} {'quiet':>7} {'flooded':>8}")
            for n in range(args.rounds):
                for flood in (False, True) if n % 2 == 0 else (True, False):
                    if flood:
                        loud.append(bench.flooded(args.jobs, args.senders, uid))
                    else:
                        quiet.append(bench.noop(args.jobs))
                print(f"{n + 1:>5} {quiet[-1]:>7.0f} {loud[-1]:>8.0f}")
        finally:
            bench.stop()
            server.terminate()
            server.wait(10)
    ratio = statistics.median(b / a for a, b in zip(quiet, loud, strict=True))
    print(f"quiet: median {statistics.median(quiet):.0f} jobs/s; flooded: median "
          f"{statistics.median(loud):.0f} jobs/s")  # fmt: skip
    print(f"flooded/quiet, median of the rounds: {ratio:.3f}")


if __name__ == "__main__":
    main()
