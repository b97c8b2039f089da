"""What one job's follow-ups cost Redis: the settle.lua call that writes them with its ack.

    python bench/follow_ups_cost.py [--quick] [--repeat 3]

For each shape of JOBD_ENQUEUE file (at the bounds a queue has by default: max_follow_ups,
max_follow_ups_bytes), one job of a queue of a private `redis-server` is read, its file parsed
(``process.followups.parse``, as the daemon does) and acknowledged with its follow-ups through
``Store.settle``: the Redis time of that call (SLOWLOG, the median of ``--repeat`` runs,
each on an empty Redis), and its weight (what counts towards max_follow_ups_bytes). A file
over a bound says so instead (it would dead-letter its job). Needs redis-server on PATH.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import string
import sys
import tempfile
from pathlib import Path

import orjson
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from spawn import start_redis

from jobd.config import load
from jobd.job import Job
from jobd.outcome import Outcome, Verb
from jobd.process import followups
from jobd.store.store import Store

NAMES = ["".join(p) for p in itertools.product(string.ascii_letters, repeat=2)]


def line(**job: object) -> bytes:
    return orjson.dumps({"queue": "t", **job}) + b"\n"


def shapes(quick: bool) -> dict[str, bytes]:
    """Files at the default bounds: most jobs, most fields, most bytes (``--quick``: small),
    each due now and due in an hour (into the delayed set: a packed member, which costs more)."""
    jobs, fields, cut = (10_000, 990, 1) if not quick else (100, 99, 10)
    names = dict.fromkeys(NAMES[:fields], "")
    big, small = 2**20 // cut, 500 // cut
    found = {}
    for later in (False, True):
        due: dict[str, object] = {"delay": 3600} if later else {}
        when = ", due in an hour" if later else ""
        found |= {
            f"{jobs} jobs, payload 'x'{when}": line(payload="x", **due) * jobs,
            f"{jobs} jobs of {small} payload bytes{when}": line(payload="x" * small, **due) * jobs,
            f"65 jobs of {fields} short fields{when}": line(payload="", fields=names, **due) * 65,
            f"7 jobs of a {big >> 10} KiB payload{when}": line(payload="x" * big, **due) * 7,
        }
    found[f"67 jobs of {fields} short fields"] = line(payload="", fields=names) * 67
    return found


def settle_ms(r: redis.Redis, config: str, data: bytes) -> tuple[float, int] | str:
    """The Redis time of the ack that writes ``data``'s follow-ups, and their weight; or why
    the file is refused."""
    cfg = load(config)
    p = cfg.queues["p"]
    r.flushall()
    r.xgroup_create(p.stream, p.group, id="0", mkstream=True)
    r.xadd(p.stream, {"payload": "x", "job_id": "p1"})
    mid, fields = r.xreadgroup(p.group, "me", {p.stream: ">"}, count=1)[0][1][0]
    job = Job.from_entry("p", mid, fields)
    try:
        found = followups.parse(data, job, p, cfg.queues)
    except followups.FollowUpError as exc:
        return str(exc)
    r.slowlog_reset()
    Store(r, "me").settle([Outcome(Verb.ACK, p, job, follow_ups=found)])
    slow = [e["duration"] for e in r.slowlog_get(100) if e["command"].startswith(b"EVALSHA")]
    return max(slow) / 1000, sum(f.weight for f in found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server, port = start_redis(Path(tmp))
        config = Path(tmp) / "c.yaml"
        config.write_text(f"redis: {{url: 'redis://127.0.0.1:{port}/0'}}\nqueues:\n"
                          "  p: {command: [/bin/true]}\n"
                          "  t: {command: [/bin/true]}\n")  # fmt: skip
        r = redis.Redis(port=port)
        r.config_set("slowlog-log-slower-than", 0)
        try:
            for name, data in shapes(args.quick).items():
                runs = [settle_ms(r, str(config), data) for _ in range(args.repeat)]
                if isinstance(runs[0], str):
                    print(f"{name}: refused: {runs[0]}")
                    continue
                ms = statistics.median(run[0] for run in runs)  # type: ignore[index]
                weight = runs[0][1]  # type: ignore[index]
                print(f"{name}: settle.lua {ms:.1f} ms of Redis, weight {weight / 2**20:.2f} MiB")
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
