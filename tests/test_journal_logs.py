"""Logs operators read (docs/operations/logs.md): under systemd, with stderr the journal's stream
(JOURNAL_STREAM is its DEVICE:INODE), each record is an entry sent in journald's native protocol
(fields a job's lines carry: JOBD_QUEUE, JOBD_JOB_ID, JOBD_ATTEMPT, JOBD_OUTCOME), or, with no
native socket, a line that starts with its sd-daemon priority; elsewhere, no prefix. The start-up
says "running" first; a job handed back and picked up again is no warning.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, acked_all, wait_group, wait_until

from jobd import logs

Daemon = Callable[..., DaemonProcess]
WARNS = "#!/bin/sh\necho oops >&2\nexit 75\n"  # retried: a warning


def start(
    config: Path, log: Path, journal: bool, native: str | None = None
) -> subprocess.Popen[bytes]:
    """`jobd run` at its default level, stderr into ``log``; with ``journal``, JOURNAL_STREAM
    names that file as systemd names the journal's socket. ``native``: the journal's native
    socket (JOBD_JOURNAL_SOCKET); without it, a path where there is none, whatever the host."""
    with open(log, "wb") as out:  # the child keeps its own copy of the descriptor
        st = os.fstat(out.fileno())
        env = {**os.environ, "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}" if journal else "",
               "JOBD_JOURNAL_SOCKET": native or str(log.parent / "no-journal-socket")}  # fmt: skip
        return subprocess.Popen([sys.executable, "-m", "jobd", "run", str(config)],
                                stdout=out, stderr=out, env=env)  # fmt: skip


def run_one_failing_job(r: redis.Redis, write_config, script, tmp_path: Path, journal: bool) -> str:
    handler = script("fail.sh", WARNS)
    config = write_config(
        f"redis: {{url: '{{redis}}'}}\nqueues:\n  q: {{command: [{handler}], "
        "retry: {max_attempts: 1}}\n"
    )
    log = tmp_path / "daemon.log"
    proc = start(config, log, journal)
    try:
        wait_group(r, "jobd:q")
        r.xadd("jobd:q", {"payload": "x"})
        wait_until(lambda: acked_all(r, "jobd:q", 1), what="the job settled")
        wait_until(lambda: "dead-lettered" in log.read_text(), what="its warning")
    finally:
        proc.terminate()
        proc.wait(30)
    return log.read_text()


def test_under_the_journal_each_line_carries_its_priority(
    r: redis.Redis, write_config, script, tmp_path: Path
) -> None:
    """Where journald's native socket is missing: lines on stderr, each with its prefix."""
    text = run_one_failing_job(r, write_config, script, tmp_path, journal=True)
    lines = text.splitlines()
    assert lines and all(re.match(r"<[2-7]>", line) for line in lines), text
    assert any(line.startswith("<4>WARNING ") and "dead-lettered" in line for line in lines), text
    assert lines[0].startswith("<6>INFO jobd.daemon: jobd running as consumer "), text
    assert not re.search(r"^<\d>\d{4}-\d\d-\d\d ", text, re.M), "journald adds its own time"


def test_elsewhere_no_prefix(r: redis.Redis, write_config, script, tmp_path: Path) -> None:
    text = run_one_failing_job(r, write_config, script, tmp_path, journal=False)
    assert not re.search(r"^<\d>", text, re.M), text
    assert re.search(r"^\d{4}-\d\d-\d\d .* WARNING .*dead-lettered", text, re.M), text


def test_a_journal_stream_of_another_file_is_not_believed(
    r: redis.Redis, write_config, script, tmp_path: Path
) -> None:
    """JOURNAL_STREAM inherited by a process whose stderr went elsewhere: no prefix."""
    other = os.stat(tmp_path)
    handler = script("ok.sh", "#!/bin/sh\nexit 0\n")
    config = write_config(f"redis: {{url: '{{redis}}'}}\nqueues:\n  q: {{command: [{handler}]}}\n")
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobd", "run", str(config)], stdout=out, stderr=out,
            env={**os.environ, "JOURNAL_STREAM": f"{other.st_dev}:{other.st_ino}"},
        )  # fmt: skip
    try:
        wait_until(lambda: "jobd running" in log.read_text(), what="the start")
    finally:
        proc.terminate()
        proc.wait(30)
    assert not re.search(r"^<\d>", log.read_text(), re.M)


def test_a_job_handed_back_and_picked_up_again_is_no_lapsed_lease(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """One slot, one read ahead: W waits behind `long`, is handed back unstarted (no slot freed
    in time) and picked up again once `long` ends: said at info, not as a lapsed lease."""
    handler = script("h.sh", '#!/bin/sh\n[ "$(cat)" = long ] && sleep 2\nexit 0\n')
    config = write_config(f"redis: {{url: '{{redis}}'}}\nqueues:\n  q: {{command: [{handler}], "
                          "concurrency: 1, prefetch: 1}\n")  # fmt: skip
    d = daemon(config)
    wait_group(r, "jobd:q")
    r.xadd("jobd:q", {"payload": "long", "job_id": "long"})
    d.wait_log("job=long attempt=1 started")
    r.xadd("jobd:q", {"payload": "W", "job_id": "W"})
    d.wait_log("job=W attempt=1 read as no slot freed in time: handed back")
    wait_until(lambda: acked_all(r, "jobd:q", 2), what="W run after long")
    assert "job=W handed back earlier; picked up again" in d.log(), d.log()
    assert "job=W lease lapsed" not in d.log()


def test_a_tracebacks_lines_are_escaped_and_each_keeps_its_priority() -> None:
    """A NUL (journald ends a line at one), a carriage return or an escape sequence in an
    exception's message is escaped, line by line, as in the message; the traceback's own
    lines stay lines, each with the record's priority."""
    try:
        raise ValueError("bad\x00<6>forged\rline\x1b[2J")
    except ValueError:
        record = logging.LogRecord("jobd.x", logging.ERROR, "", 0, "it\x00failed", (), None)
        record.exc_info = sys.exc_info()
    text = logs.prefixed(logs.TextFormatter("%(levelname)s %(name)s: %(message)s")).format(record)
    lines = text.split("\n")
    assert lines[0] == "<3>ERROR jobd.x: it\\x00failed"
    assert lines[1] == "<3>Traceback (most recent call last):"
    assert lines[-1] == "<3>ValueError: bad\\x00<6>forged\\x0dline\\x1b[2J", lines
    assert all(line.startswith("<3>") for line in lines) and len(lines) > 3
    assert not re.search(r"[\x00-\x1f]", text.replace("\n", "")), text


# -- journald's native protocol (systemd.io/JOURNAL_NATIVE_PROTOCOL) ------------------------


def parse(datagram: bytes) -> dict[str, bytes]:
    """One entry as journald reads it: ``KEY=value\\n``, or (a value with a newline) ``KEY\\n``,
    its length as 64-bit little-endian, the value and ``\\n``."""
    fields: dict[str, bytes] = {}
    at = 0
    while at < len(datagram):
        end = datagram.index(b"\n", at)
        key, equals, value = datagram[at:end].partition(b"=")
        if equals:
            at = end + 1
        else:
            size = int.from_bytes(datagram[end + 1 : end + 9], "little")
            value = datagram[end + 9 : end + 9 + size]
            assert datagram[end + 9 + size : end + 10 + size] == b"\n", datagram
            at = end + 10 + size
        assert key.decode().isupper() and key not in fields, datagram
        fields[key.decode()] = value
    return fields


class Journal:
    """A stand-in for journald's native socket: a datagram socket bound in a short directory (a
    socket's path has at most 107 bytes), each datagram parsed as it arrives."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="jobd-journal-")
        self.path = os.path.join(self.dir, "socket")
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.socket.bind(self.path)
        self.socket.settimeout(0.05)
        self.raw: list[bytes] = []
        self.stop = threading.Event()
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(TimeoutError):
                self.raw.append(self.socket.recv(1 << 24))

    def entries(self) -> list[dict[str, bytes]]:
        return [parse(datagram) for datagram in list(self.raw)]

    def find(self, **fields: str) -> dict[str, bytes] | None:
        wanted = {key: value.encode() for key, value in fields.items()}
        return next((e for e in self.entries() if wanted.items() <= e.items()), None)

    def close(self) -> None:
        self.stop.set()
        self.reader.join()
        self.socket.close()
        shutil.rmtree(self.dir)


OK_OR_FAIL = '#!/bin/sh\n[ "$(cat)" = fail ] && { echo oops >&2; exit 75; }\nexit 0\n'


def test_under_systemd_a_job_s_outcome_is_an_entry_with_its_fields(
    r: redis.Redis, write_config, script, tmp_path: Path
) -> None:
    """`journalctl JOBD_QUEUE=email` finds the queue's jobs: each record is one datagram to the
    native socket, with its priority and, on a job's line, the job's fields; nothing on stderr."""
    handler = script("h.sh", OK_OR_FAIL)
    config = write_config(f"redis: {{url: '{{redis}}'}}\nqueues:\n  email: {{command: [{handler}], "
                          "retry: {max_attempts: 1}}\n")  # fmt: skip
    log = tmp_path / "daemon.log"
    journal = Journal()
    try:
        proc = start(config, log, journal=True, native=journal.path)
        try:
            wait_group(r, "jobd:email")
            r.xadd("jobd:email", {"payload": "ok", "job_id": "ok-1"})
            r.xadd("jobd:email", {"payload": "fail", "job_id": "bad-1"})
            done = wait_until(lambda: journal.find(JOBD_JOB_ID="ok-1", JOBD_OUTCOME="done"),
                              what="ok-1's entry")  # fmt: skip
            dead = wait_until(lambda: journal.find(JOBD_JOB_ID="bad-1", JOBD_OUTCOME="dead-lettered"),
                              what="bad-1's entry")  # fmt: skip
        finally:
            proc.terminate()
            proc.wait(30)
        entries = journal.entries()
    finally:
        journal.close()
    assert done["JOBD_QUEUE"] == b"email" and done["JOBD_ATTEMPT"] == b"1", done
    assert done["PRIORITY"] == b"6" and done["SYSLOG_IDENTIFIER"] == b"jobd", done
    assert done["LOGGER"] == b"jobd.handler", done
    assert done["MESSAGE"].startswith(b"INFO jobd.handler: queue=email job=ok-1 "), done
    assert dead["PRIORITY"] == b"4" and dead["JOBD_ERROR"] == b"exit", dead
    assert dead["MESSAGE"].startswith(b"WARNING "), dead
    assert entries[0]["MESSAGE"].startswith(b"INFO jobd.daemon: jobd running as consumer "), entries
    assert "JOBD_QUEUE" not in entries[0], entries[0]
    output = [e for e in entries if e["MESSAGE"].endswith(b"stderr: oops")]
    assert output and output[0]["JOBD_JOB_ID"] == b"bad-1" and "JOBD_OUTCOME" not in output[0]
    text = log.read_text()
    assert "job=ok-1" not in text and "jobd running" not in text, "logged twice: " + text


def journal_handler(path: str) -> tuple[logs.JournalHandler, io.StringIO]:
    stderr = io.StringIO()
    handler = logs.JournalHandler(path, stream=stderr)
    handler.setFormatter(logs.TextFormatter("%(levelname)s %(name)s: %(message)s"))
    return handler, stderr


def record(message: str, level: int = logging.ERROR, exc: bool = False) -> logging.LogRecord:
    try:
        raise ValueError("first line\nsecond line")
    except ValueError:
        info = sys.exc_info() if exc else None
    return logging.LogRecord("jobd.test", level, __file__, 1, message, (), info)


def test_a_record_of_several_lines_is_one_entry_its_message_in_the_binary_form() -> None:
    journal = Journal()
    try:
        handler, stderr = journal_handler(journal.path)
        handler.handle(record("queue=q job=a\nb attempt=2 cannot start", exc=True))
        entry = wait_until(lambda: journal.entries(), what="the entry")[0]  # type: ignore[index]
        raw = journal.raw[0]
        handler.close()
    finally:
        journal.close()
    message = entry["MESSAGE"].decode()
    assert message.startswith("ERROR jobd.test: queue=q job=a\\x0ab attempt=2 cannot start\n")
    assert message.endswith("ValueError: first line\nsecond line"), message
    assert b"MESSAGE\n" + len(entry["MESSAGE"]).to_bytes(8, "little") in raw, raw
    assert entry["JOBD_JOB_ID"] == b"a\\x0ab" and entry["JOBD_ATTEMPT"] == b"2", entry
    assert entry["PRIORITY"] == b"3" and stderr.getvalue() == ""


def test_a_record_the_journal_does_not_take_goes_to_stderr_with_its_priority() -> None:
    """Never lost: the socket's queue full (journald behind), a record over the datagram's
    limit, the socket gone (journald stopped): that record is a prefixed line on stderr."""
    journal = Journal()
    journal.stop.set()  # read nothing: the socket's queue fills
    journal.reader.join()
    try:
        handler, stderr = journal_handler(journal.path)
        with open("/proc/sys/net/unix/max_dgram_qlen") as f:
            many = int(f.read()) + 20
        for n in range(many):
            handler.handle(record(f"queue=q job=j{n} attempt=1 done", logging.INFO))
        taken = 0
        while True:
            try:
                taken += bool(journal.socket.recv(1 << 16))
            except TimeoutError:
                break
        lines = stderr.getvalue().splitlines()
        assert lines and taken + len(lines) == many and handler.fallbacks == len(lines)
        assert lines[-1] == f"<6>INFO jobd.test: queue=q job=j{many - 1} attempt=1 done"
        huge = "x" * handler.socket.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        handler.handle(record(huge, logging.WARNING))
        assert stderr.getvalue().endswith(f"<4>WARNING jobd.test: {huge}\n")
        os.unlink(journal.path)
        handler.handle(record("after the journal stopped", exc=True))
        tail = stderr.getvalue().split(huge)[1].splitlines()
        assert tail[1] == "<3>ERROR jobd.test: after the journal stopped", tail
        assert tail[-1] == "<3>second line" and all(line.startswith("<3>") for line in tail[1:])
        handler.close()
    finally:
        journal.close()
