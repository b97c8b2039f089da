#!/usr/bin/env python3
"""A jobd handler in Python: the payload is a JSON object {"title": ..., "numbers": [...]}.

Exit 0: done. Exit 65 (EX_DATAERR): bad input, dead-letter it. Exit 75 (EX_TEMPFAIL): retry later.
"""

import json
import os
import sys
from pathlib import Path

EX_DATAERR, EX_TEMPFAIL = 65, 75


def main() -> int:
    job_id = os.environ["JOBD_JOB_ID"]  # stable across retries: the key for idempotency
    out_dir = Path(os.environ.get("EXAMPLE_STATE", "/tmp/jobd-example")) / "reports"
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{job_id}.txt"
    if target.exists():
        print(f"report {job_id} already written")
        return 0
    try:
        job = json.load(sys.stdin)
        numbers = [float(n) for n in job["numbers"]]
        title = str(job.get("title", "report"))
    except (ValueError, KeyError, TypeError) as exc:
        print(f"bad payload: {exc}", file=sys.stderr)
        return EX_DATAERR
    if not os.access(out_dir, os.W_OK):
        print(f"{out_dir} is not writable yet; try again later", file=sys.stderr)
        return EX_TEMPFAIL
    text = f"{title}\ncount={len(numbers)} sum={sum(numbers):g}\n"
    tmp = target.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.rename(target)  # atomic: a crash never leaves half a report behind
    print(f"wrote {target} (attempt {os.environ['JOBD_ATTEMPT']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
