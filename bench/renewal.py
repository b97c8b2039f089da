"""One lease-renewal tick with many jobs in flight: round trips and milliseconds.

    python bench/renewal.py [--in-flight 1000] [--repeat 50]

Compares, in the same run against the same private redis-server:
  jobd      lua/renew.lua: the ownership check and XCLAIM … JUSTID of every entry, in one call;
  pipeline  the same work as 2 commands per entry (XPENDING, XCLAIM) in one pipeline — one
            round trip too, but with a window between check and claim (not safe);
  per-entry the same 2 commands per entry, each its own round trip: what a naive loop costs.
Commands are counted by the server (INFO commandstats); times are medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spawn import start_redis

from jobd.config import load
from jobd.store.store import Store


def measure(r: redis.Redis, repeat: int, tick: Callable[[], int]) -> tuple[int, int, float]:
    """Round trips of one tick (as the tick reports them), the commands Redis ran for it
    (counted by the server, script-internal calls included), and its median milliseconds."""
    times, commands = [], []
    for _ in range(repeat):
        before = _commands(r)
        start = time.perf_counter()
        trips = tick()
        times.append((time.perf_counter() - start) * 1000)
        commands.append(_commands(r) - before)
    return trips, round(statistics.median(commands)), statistics.median(times)


def _commands(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if not k.startswith("cmdstat_info"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-flight", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server, port = start_redis(Path(tmp))
        try:
            cfg = Path(tmp) / "c.yaml"
            cfg.write_text(
                f"redis: {{url: 'redis://127.0.0.1:{port}/0'}}\n"
                "queues:\n  q: {command: [/bin/true]}\n"
            )
            queue = load(str(cfg)).queues["q"]
            r = redis.Redis(port=port)
            r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
            pipe = r.pipeline(transaction=False)
            for i in range(args.in_flight):
                pipe.xadd("jobd:q", {"payload": str(i)})
            pipe.execute()
            reply = r.xreadgroup("jobd", "me", {"jobd:q": ">"}, count=args.in_flight)
            ids = [mid.decode() for mid, _ in reply[0][1]]
            store = Store(r, "me")

            def jobd_tick() -> int:
                assert store.renew(queue, ids) == []
                return 1

            def pipeline_tick() -> int:
                p = r.pipeline(transaction=False)
                for mid in ids:
                    p.xpending_range("jobd:q", "jobd", mid, mid, 1)
                    p.xclaim("jobd:q", "jobd", "me", 0, [mid], justid=True)
                p.execute()
                return 1

            def per_entry_tick() -> int:
                for mid in ids:
                    r.xpending_range("jobd:q", "jobd", mid, mid, 1)
                    r.xclaim("jobd:q", "jobd", "me", 0, [mid], justid=True)
                return 2 * len(ids)

            jobd_tick()  # load the script
            rows = [
                ("jobd (renew.lua)", *measure(r, args.repeat, jobd_tick)),
                ("pipeline", *measure(r, args.repeat, pipeline_tick)),
                ("per-entry", *measure(r, max(3, args.repeat // 10), per_entry_tick)),
            ]
            deliveries = {
                e["times_delivered"] for e in r.xpending_range("jobd:q", "jobd", "-", "+", 10)
            }
            base = rows[0][3]
            print(
                f"one renewal tick, {len(ids)} entries in flight "
                f"(delivery counts after: {deliveries})"
            )
            print(
                f"{'method':<18} {'round trips':>11} {'commands':>9} {'ms/tick':>9} {'vs jobd':>8}"
            )
            for name, trips, commands, ms in rows:
                print(f"{name:<18} {trips:>11} {commands:>9} {ms:>9.2f} {ms / base:>7.1f}x")
        finally:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()
