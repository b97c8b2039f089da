#!/usr/bin/env python3
"""The pipeline's failure hook: every queue's `on_dead_letter` sends its dead-letter records
here, as JSON (as `jobd dlq show --json` prints them, plus "queue"). This one appends a line
per record to PIPELINE_OUT/alerts.log; page someone from here instead.
"""

import json
import os
import sys
from pathlib import Path


def main() -> int:
    record = json.load(sys.stdin)
    fields = record["fields"]
    queue, why = record["queue"], fields.get("jobd_stderr", "").strip()
    line = (f"{queue} job {record['job_id']} dead-lettered ({fields.get('jobd_error')}): "
            f"{why} [jobd dlq -c config/pipeline.yaml {queue} show {record['id']}]")  # fmt: skip
    out = Path(os.environ.get("PIPELINE_OUT", "/tmp/jobd-pipeline"))
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "alerts.log", "a") as log:
        log.write(line.replace("\n", " ") + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
