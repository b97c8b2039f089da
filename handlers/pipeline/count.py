#!/usr/bin/env python3
"""Pipeline step 3, the fanned-out work: count the words of one paragraph. The counts are its
result (JOBD_RESULT); the queue's `then:` sends the result to aggregate.
"""

import collections
import json
import os
import sys

EX_DATAERR = 65


def main() -> int:
    try:
        job = json.load(sys.stdin)
        counts = collections.Counter(str(w) for w in job["words"])
        part = {"doc": str(job["doc"]), "part": int(job["part"]), "parts": int(job["parts"])}
    except (ValueError, KeyError, TypeError) as exc:
        print(f"not a paragraph: {exc}", file=sys.stderr)
        return EX_DATAERR
    with open(os.environ["JOBD_RESULT"], "w") as out:
        json.dump({**part, "counts": dict(counts)}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
