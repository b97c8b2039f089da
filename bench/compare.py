"""Two checkouts of jobd side by side in one run: did a change make throughput better?

    python bench/compare.py OLD_CHECKOUT NEW_CHECKOUT [--jobs 2000] [--rounds 8]

Each checkout's daemon runs /bin/true handlers at concurrency 8 on its own queue of one
`redis-server`; the rounds alternate which goes first, and each round also measures
`xargs -P8`. It prints both medians, each one's ratio to xargs, and the median of NEW/OLD per
round: a change is worth keeping when that ratio stays above 1 over a few runs (a single
round varies by ±10 % on the 2-core build machine). Make the old checkout with, for example,
`git worktree add /tmp/old HEAD~1`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spawn import Jobd, start_redis, xargs_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server, port = start_redis(Path(tmp))
        pair = [
            Jobd(Path(tmp), port, 8, queue="old", tree=args.old.resolve()),
            Jobd(Path(tmp), port, 8, queue="new", tree=args.new.resolve()),
        ]
        rates: list[list[float]] = [[], []]
        bases: list[float] = []
        try:
            print(f"{'round':>5} {'xargs':>7} {'old':>7} {'new':>7}")
            for n in range(args.rounds):
                bases.append(xargs_rate(args.jobs, 8))
                for k in (0, 1) if n % 2 == 0 else (1, 0):
                    rates[k].append(pair[k].rate(args.jobs))
                print(f"{n + 1:>5} {bases[-1]:>7.0f} {rates[0][-1]:>7.0f} {rates[1][-1]:>7.0f}")
        finally:
            for checkout in pair:
                checkout.stop()
            server.terminate()
            server.wait(10)
    for name, r in zip(("old", "new"), rates, strict=True):
        ratio = statistics.median(a / b for a, b in zip(r, bases, strict=True))
        print(f"{name}: median {statistics.median(r):.0f} jobs/s, ratio to xargs {ratio:.3f}")
    change = statistics.median(b / a for a, b in zip(*rates, strict=True))
    print(f"new/old, median of the rounds: {change:.3f}")


if __name__ == "__main__":
    main()
