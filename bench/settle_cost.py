"""What settling a job costs, in Redis's CPU and in the recorder's: two checkouts side by side.

    python bench/settle_cost.py OLD_CHECKOUT NEW_CHECKOUT [--calls 200] [--batch 50] [--rounds 3]

Each checkout's ``Store.settle`` acknowledges ``--calls`` × ``--batch`` jobs (``--batch`` acks a
call, as the recorder sends them), read by one consumer from one stream of a private
`redis-server`; Redis's CPU (INFO cpu, user + system) and the calling process's CPU are summed
over the calls alone. The rounds alternate which checkout goes first. It prints µs per job of
each, and new − old. (Issue 19 measured job history and events with it: OLD the commit before.)
Needs redis-server (or valkey-server) on PATH.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spawn import start_redis

ONE = """
import sys, time
import redis
from jobd.config import load
from jobd.job import Job
from jobd.outcome import Outcome, Verb
from jobd.store.store import Store
config, calls, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
q = load(config).queues["q"]
r = redis.Redis(port=int(sys.argv[4]))
r.delete(q.stream, *r.keys("{" + q.stream + "}*"))
r.xgroup_create(q.stream, q.group, id="0", mkstream=True)
pipe = r.pipeline(transaction=False)
for i in range(calls * batch):
    pipe.xadd(q.stream, {"payload": "x", "job_id": f"j{i}"})
pipe.execute()
store = Store(r, "me")
def cpu():
    info = r.info("cpu")
    return info["used_cpu_sys"] + info["used_cpu_user"]
redis_s = own_s = 0.0
for _ in range(calls):
    read = r.xreadgroup(q.group, "me", {q.stream: ">"}, count=batch)[0][1]
    outcomes = [Outcome(Verb.ACK, q, Job.from_entry("q", mid, f)) for mid, f in read]
    c0, t0 = cpu(), time.process_time()
    store.settle(outcomes)
    own_s += time.process_time() - t0
    redis_s += cpu() - c0
print(redis_s / (calls * batch) * 1e6, own_s / (calls * batch) * 1e6)
"""


def measure(tree: Path, config: Path, port: int, calls: int, batch: int) -> tuple[float, float]:
    env = {"PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", ONE, str(config), str(calls), str(batch), str(port)],
        capture_output=True, text=True, check=True, env=env, cwd=tree,
    )  # fmt: skip
    redis_us, own_us = map(float, out.stdout.split())
    return redis_us, own_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server, port = start_redis(Path(tmp))
        config = Path(tmp) / "c.yaml"
        config.write_text(f"redis: {{url: 'redis://127.0.0.1:{port}/0'}}\n"
                          "queues:\n  q: {command: [/bin/true]}\n")  # fmt: skip
        found: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
        try:
            for n in range(args.rounds):
                order = [("old", args.old), ("new", args.new)]
                for name, tree in order if n % 2 == 0 else reversed(order):
                    found[name].append(
                        measure(tree.resolve(), config, port, args.calls, args.batch)
                    )
        finally:
            server.terminate()
            server.wait()
    medians = {k: [statistics.median(x[i] for x in v) for i in (0, 1)] for k, v in found.items()}
    for name in ("old", "new"):
        redis_us, own_us = medians[name]
        print(f"{name}: Redis {redis_us:.1f} µs/job, caller {own_us:.1f} µs/job")
    print(f"new - old: Redis {medians['new'][0] - medians['old'][0]:+.1f} µs/job, "
          f"caller {medians['new'][1] - medians['old'][1]:+.1f} µs/job")  # fmt: skip


if __name__ == "__main__":
    main()
