"""medium: a command whose stdout reader has gone ends with 0 whatever the command's own exit
code was: `jobd dlq q requeue --all | …` that left a dead letter in place exits 0, not 1.

What is wrong: since 81be2bd (review 35aa's `| head` traceback) jobd/cli/main.py flushes stdout
inside the command's guard and answers a BrokenPipeError with ``exitcodes.OK``, dropping the
code ``dispatch`` already returned (and, for an EPIPE raised inside ``dispatch`` by a command
that does not catch its own, the fact that the command stopped half-way). Before, the flush at
the interpreter's exit failed with 120: ugly, but not a success. `jobd dlq requeue` says a
record left in place with exit 1 (cli/dlq.py ``requeue``: "1 when one is left in place"); a
script with `set -o pipefail` piping its summary into a reader that stops early (or dies) now
reads "every dead letter requeued". (Commands that catch EPIPE themselves, ``print_json``,
`jobd job`, `jobd events`, keep their code: `--json` hides nothing.)

Reproduce: two records in q's dead-letter stream, a job and a clipped one (jobd_clipped: left
in place); `jobd dlq -c CFG q requeue --all` exits 1 with a reader, 0 with stdout a pipe whose
reader has closed, and its stderr is empty: the EPIPE came at the summary's print, inside
``dispatch``, before the records left in place were said. The failure is neither said nor
signalled.

What should happen: a reader gone is quiet (no traceback), but the exit code stays what the
command decided: the code ``dispatch`` returned when the EPIPE came at the final flush; a
non-zero one (141, as a shell reports SIGPIPE, say) when it came inside ``dispatch``, whose
work may have been cut short.

Suggested fix: catch BrokenPipeError around the flush alone (``try: sys.stdout.flush() except
BrokenPipeError: dup2 devnull`` then ``return code``), and let the outer handler return
128 + SIGPIPE for an EPIPE raised while the command ran.

Fixed (review 35ab, by the lead): while a command runs, stdout is a writer that drops what its
reader can no longer take (jobd/cli/common.py ``reader_may_go``), so the command goes on to its
end, says its errors on stderr and exits with its own code; no BrokenPipeError is caught around
the command any more.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import redis

from jobd import exitcodes

CONFIG = "redis: {url: '{redis}'}\nqueues:\n  q: {command: [/bin/true]}\n"


def requeue_all(cfg: Path, stdout: int) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "jobd", "dlq", "-c", str(cfg), "q", "requeue", "--all"],
        stdout=stdout, stderr=subprocess.PIPE, timeout=60, check=False,
    )  # fmt: skip


def test_a_gone_reader_does_not_turn_a_failed_requeue_into_success(
    r: redis.Redis, write_config: Callable[..., Path]
) -> None:
    cfg = write_config(CONFIG)

    def dead_letters() -> None:
        r.xadd("{jobd:q}:dead", {"payload": "x", "jobd_job_id": "j1", "jobd_error": "exit",
                                 "jobd_failed_at": "1"})  # fmt: skip
        r.xadd("{jobd:q}:dead", {"payload": "y", "jobd_clipped": "9"})  # left in place: exit 1

    dead_letters()
    seen = requeue_all(cfg, subprocess.PIPE)  # a reader that reads all: the command's own code
    assert seen.returncode == exitcodes.FAILURE, (seen.returncode, seen.stdout, seen.stderr)
    assert b"left dead letter" in seen.stderr
    r.delete("{jobd:q}:dead", "jobd:q")
    dead_letters()
    read, write = os.pipe()
    os.close(read)  # the reader has gone: the final flush fails with EPIPE
    try:
        done = requeue_all(cfg, write)
    finally:
        os.close(write)
    assert b"Traceback" not in done.stderr, done.stderr
    assert done.returncode == exitcodes.FAILURE, (done.returncode, done.stderr)
    assert b"left dead letter" in done.stderr  # the same work, the same failure said
