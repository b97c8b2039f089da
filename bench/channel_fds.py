"""What a message carrying 253 descriptors costs the handlers' channel's thread.

    python bench/channel_fds.py [--messages 2000] [--rounds 3] [--pause MS]

A ``Channel`` of its own (no daemon, no Redis), its thread started with no handler: a process
of no job sends it ``--messages`` messages of 253 pipe ends each (the same ones each time, its
own copies kept: review 34c's flood), as fast as the socket takes them. Prints, per round,
the wall time per message until the thread has read them all, and the CPU time the channel's
thread spent per message (its /proc/self/task/TID/stat: what the thread holds the GIL for, and
its system calls), and in how many messages the kernel dropped the descriptors (more waited
for the sink than ``daemon.disposer`` keeps: a flood outruns the sink), then the medians.
``--pause`` paces the sender (a pause after each message) so that the sink keeps up.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from support import descriptor_flooder  # the tests' flooder (review 34c), counted and paced

from jobd.daemon.channel import Channel

TICK = os.sysconf("SC_CLK_TCK")


def cpu(tid: int) -> float:
    """Seconds of CPU (user + system) the thread ``tid`` of this process has used."""
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def round_(messages: int, pause: float) -> tuple[float, float, int]:
    channel = Channel()
    channel.start({}, lambda pid: None)
    tid = channel.thread.native_id
    assert tid is not None
    began, used = time.monotonic(), cpu(tid)
    child = descriptor_flooder("\0" + channel.address[1:], messages, pause)
    while channel.count < messages:
        time.sleep(0.01)
        channel.take({})  # as the loop would ("drained" items)
    took, spent = time.monotonic() - began, cpu(tid) - used
    os.waitpid(child, 0)
    channel.close()
    return took / messages, spent / messages, channel.dropped.get(("", "descriptors"), 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pause", type=float, default=0.0, help="ms after each message")
    args = parser.parse_args()
    walls, cpus = [], []
    for n in range(args.rounds):
        wall, used, dropped = round_(args.messages, args.pause / 1e3)
        walls.append(wall)
        cpus.append(used)
        print(f"round {n + 1}: {wall * 1e3:.3f} ms a message, channel thread CPU "
              f"{used * 1e3:.3f} ms a message, descriptors dropped in {dropped} of "
              f"{args.messages} messages")  # fmt: skip
    print(f"median: {statistics.median(walls) * 1e3:.3f} ms a message (wall), "
          f"{statistics.median(cpus) * 1e3:.3f} ms (channel thread CPU)")  # fmt: skip


if __name__ == "__main__":
    main()
