#!/usr/bin/env python3
"""Pipeline step 1, fetch: the payload names a document (an http(s):// URL, or a file's path,
relative to the queue's `cwd`: the repository's root in config/pipeline.yaml); its text goes on,
with the document's id, as one JSON object on stdout (the queue's `then:` sends stdout to
transform).

Exit 65 (EX_DATAERR): no such document (dead-lettered at once: on_dead_letter tells alerts).
Exit 75 (EX_TEMPFAIL): the server did not answer (retried with backoff).
"""

import json
import os
import sys
import urllib.error
import urllib.request

EX_DATAERR, EX_TEMPFAIL = 65, 75
MAX_BYTES = 48 * 1024  # within the queue's result_max (64KiB) once in JSON, for most texts


def fetch(source: str) -> bytes:
    if source.startswith(("http://", "https://")):
        with urllib.request.urlopen(source, timeout=30) as reply:
            return reply.read(MAX_BYTES + 1)
    with open(source, "rb") as f:
        return f.read(MAX_BYTES + 1)


def main() -> int:
    source = sys.stdin.read().strip()
    try:
        data = fetch(source)
    except urllib.error.HTTPError as exc:
        print(f"{source}: HTTP {exc.code}", file=sys.stderr)
        return EX_DATAERR if 400 <= exc.code < 500 else EX_TEMPFAIL
    except (urllib.error.URLError, TimeoutError) as exc:
        print(f"{source}: {exc}", file=sys.stderr)
        return EX_TEMPFAIL
    except OSError as exc:
        print(f"{source}: {exc.strerror}", file=sys.stderr)
        return EX_DATAERR
    if len(data) > MAX_BYTES:
        print(f"{source}: more than {MAX_BYTES} bytes", file=sys.stderr)
        return EX_DATAERR
    text = data.decode("utf-8", "replace")
    json.dump({"doc": os.environ["JOBD_JOB_ID"], "source": source, "text": text}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
