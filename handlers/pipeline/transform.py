#!/usr/bin/env python3
"""Pipeline step 2, transform and fan out: the document (fetch's JSON) is cut into paragraphs,
each normalised to its lower-case words; each paragraph becomes a job of the queue `count`,
written as one line into the file JOBD_ENQUEUE names. jobd enqueues them all when this
handler exits 0, with its acknowledgement: a crash or a retry never leaves half of them.
"""

import json
import os
import re
import sys

EX_DATAERR = 65
WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)*")


def main() -> int:
    try:
        doc = json.load(sys.stdin)
        name, text = str(doc["doc"]), str(doc["text"])
    except (ValueError, KeyError, TypeError) as exc:
        print(f"not a fetched document: {exc}", file=sys.stderr)
        return EX_DATAERR
    paragraphs = [p for p in re.split(r"\n\s*\n", text) if WORD.search(p)]
    if not paragraphs:
        print(f"{name}: no words", file=sys.stderr)
        return EX_DATAERR
    with open(os.environ["JOBD_ENQUEUE"], "w") as out:
        for part, paragraph in enumerate(paragraphs, 1):
            words = [w.lower() for w in WORD.findall(paragraph)]
            job = {"doc": name, "part": part, "parts": len(paragraphs), "words": words}
            out.write(json.dumps({"queue": "count", "payload": job}) + "\n")
    print(f"{name}: {len(paragraphs)} paragraph(s) to count")
    return 0


if __name__ == "__main__":
    sys.exit(main())
