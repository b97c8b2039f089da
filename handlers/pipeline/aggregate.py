#!/usr/bin/env python3
"""Pipeline step 4, aggregate: each paragraph's counts are kept in a file of their own under
PIPELINE_OUT/DOC/; the job that brings the last one writes the document's report,
PIPELINE_OUT/DOC/report.json (total words, distinct words, the ten most frequent, ties in
alphabetical order).

Every write is a whole file put in place by rename, and a part written twice is the same file:
a job run again (its daemon died as it finished) changes nothing. The document's folder is
locked while a part is added and counted (flock), so two parts arriving at once, from two
daemons of this host, cannot both miss the other.
"""

import collections
import fcntl
import json
import os
import sys
from pathlib import Path

EX_DATAERR = 65


def _most(item: tuple[str, int]) -> tuple[int, str]:
    return -item[1], item[0]  # the most frequent first; ties in alphabetical order


def put(path: Path, data: object) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data, sort_keys=True))
    tmp.rename(path)


def main() -> int:
    try:
        part = json.load(sys.stdin)
        doc, n, parts = str(part["doc"]), int(part["part"]), int(part["parts"])
        counts = {str(w): int(c) for w, c in part["counts"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        print(f"not a paragraph's counts: {exc}", file=sys.stderr)
        return EX_DATAERR
    folder = Path(os.environ.get("PIPELINE_OUT", "/tmp/jobd-pipeline")) / doc.replace("/", "_")
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return add(folder, doc, n, parts, counts)


def add(folder: Path, doc: str, n: int, parts: int, counts: dict[str, int]) -> int:
    put(folder / f"part-{n}.json", counts)
    have = sorted(folder.glob("part-*.json"))
    if len(have) < parts:
        print(f"{doc}: {len(have)} of {parts} paragraphs counted")
        return 0
    total: collections.Counter[str] = collections.Counter()
    for path in have:
        total.update(json.loads(path.read_text()))
    report = {"doc": doc, "paragraphs": parts, "words": sum(total.values()),
              "distinct": len(total), "top": sorted(total.items(), key=_most)[:10]}  # fmt: skip
    put(folder / "report.json", report)
    print(f"{doc}: report written, {report['words']} words")
    return 0


if __name__ == "__main__":
    sys.exit(main())
