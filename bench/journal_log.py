"""What a log record costs sent to the journal's native socket, beside the stderr line it was.

    python bench/journal_log.py [--records 20000] [--rounds 9]

Times ``Handler.handle`` of the line that ends a job (its tag, its exit and an outcome's
fields), rounds alternating: the stderr handler as it is under systemd (the text format with
its ``<6>`` prefix, each line written to a stream socket as the journal's stdout stream is),
and ``logs.JournalHandler`` (one datagram a record to a datagram socket). A child process
drains each socket, as journald would. Prints µs of CPU a record for each (the best round, which a
busy machine disturbs least, and the median), the ratio of the best, and how many records the
journal handler wrote to its fallback instead (the socket's queue was full: its length is
``net.unix.max_dgram_qlen``, 512 under systemd, often 10 elsewhere).
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from jobd import logs

DRAIN = """import socket, sys
s = socket.socket(socket.AF_UNIX, getattr(socket, sys.argv[2]))
s.bind(sys.argv[1])
if sys.argv[2] == "SOCK_STREAM":
    s.listen(1)
print("ready", flush=True)
if sys.argv[2] == "SOCK_STREAM":
    s = s.accept()[0]
while s.recv(1 << 16):
    pass
"""


def drain(path: str, kind: str) -> subprocess.Popen[bytes]:
    child = subprocess.Popen([sys.executable, "-c", DRAIN, path, kind], stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"ready\n"
    return child


def job_end() -> logging.LogRecord:
    record = logging.LogRecord("jobd.handler", logging.INFO, "", 0, "%s %s after %.3fs%s: %s",
                               ("queue=email job=0b6c2f1e-5d1a attempt=1", "exit 0", 0.0123,
                                " (cpu 0.002s, max rss 3.1MiB)", "ack"), None)  # fmt: skip
    record.journal = {"JOBD_OUTCOME": "done"}
    return record


def timed(handler: logging.Handler, records: int) -> float:
    """µs of this thread's CPU (its system calls' included) a record, ``records`` of them
    handled one after the other: what the loop pays, whatever else the machine runs."""
    start = time.thread_time()
    for _ in range(records):
        handler.handle(job_end())
    return (time.thread_time() - start) / records * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    here = tempfile.mkdtemp(prefix="jobd-bench-")
    stream_path, dgram_path = os.path.join(here, "stream"), os.path.join(here, "dgram")
    children = [drain(stream_path, "SOCK_STREAM"), drain(dgram_path, "SOCK_DGRAM")]
    out = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    out.connect(stream_path)
    formatter = logs.TextFormatter("%(levelname)s %(name)s: %(message)s")
    stream = open(out.fileno(), "w", buffering=1, closefd=False)  # noqa: SIM115
    stderr = logs.LineHandler(stream)
    stderr.setFormatter(logs.prefixed(logs.TextFormatter("%(levelname)s %(name)s: %(message)s")))
    journal = logs.JournalHandler(dgram_path, stream=io.StringIO())
    journal.setFormatter(formatter)
    results: dict[str, list[float]] = {"stderr": [], "journal": []}
    for n in range(args.rounds):
        order = ["stderr", "journal"] if n % 2 == 0 else ["journal", "stderr"]
        for name in order:
            results[name].append(timed(stderr if name == "stderr" else journal, args.records))
    for name, what in (("stderr", "stderr line (<6> prefix, stream socket)"),
                       ("journal", "journal datagram (native protocol)     ")):  # fmt: skip
        best, median = min(results[name]), statistics.median(results[name])
        print(f"{what}: best {best:.2f} µs a record, median {median:.2f}")
    line, native = min(results["stderr"]), min(results["journal"])
    print(f"journal / stderr: {native / line:.2f}× ({native - line:+.2f} µs a record)")
    print(f"fallbacks to stderr: {journal.fallbacks} of {args.records * args.rounds}")
    stream.close()
    out.close()
    journal.close()
    for child in children:
        child.kill()
        child.wait()


if __name__ == "__main__":
    main()
