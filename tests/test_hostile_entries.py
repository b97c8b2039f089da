"""Hostile entries XADDed straight by a producer, through one running daemon per test: any bytes
as field names and values, non-UTF-8 job ids, garbage in the reserved jobd_* fields, very wide
entries, payloads around max_payload; on queues with and without a dedupe window, whose handler
exits 0, fails permanently (65, in exit_codes.fail) or fails its first attempt (75, retried).

Every entry must end in one of two ways: its handler ran (once) and then, as the handler's exit
says, it was acknowledged, dead-lettered (exit) or retried until acknowledged; or it is on the
dead-letter stream unrun, with a jobd_error. The group's PEL and the delayed set must drain, a
normal job enqueued afterwards must still run, and the daemon must not die or log a traceback.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
import redis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from support import (
    DaemonProcess,
    group_info,
    jobd_cli,
    pending_count,
    queue_config,
    wait_until,
)

Daemon = Callable[..., DaemonProcess]

SETTLE = 8.0  # seconds a batch may take to settle (healthy: 1-2 s; reclaim_after is 1 s)
MODES = ("ok", "fail", "retry")


# -- the daemon and its handler ---------------------------------------------------------------


def handler(script, tmp_path: Path) -> Path:
    """One handler for every queue, its mode in argv: one line per run (O_APPEND, one write)
    with the queue, the delivery's stream id, the job id (hex: any bytes), the attempt, the
    bytes read from stdin and JOBD_PAYLOAD_BYTES."""
    ran = tmp_path / "ran"
    script(
        "h.py",
        f"""
        #!{sys.executable} -S
        import os, sys
        data = sys.stdin.buffer.read()
        env = os.environb
        line = b" ".join([
            env[b"JOBD_QUEUE"], env[b"JOBD_MESSAGE_ID"], env[b"JOBD_JOB_ID"].hex().encode() or b"-",
            env[b"JOBD_ATTEMPT"], str(len(data)).encode(), env[b"JOBD_PAYLOAD_BYTES"],
        ]) + b"\\n"
        fd = os.open({str(ran)!r}, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, line)
        os.close(fd)
        mode = sys.argv[1]
        if mode == "fail":
            sys.exit(65)
        if mode == "retry" and env[b"JOBD_ATTEMPT"] == b"1":
            sys.exit(75)
        """,
    )
    return ran


def config(queues: dict[str, str]) -> str:
    """A config with ``queues`` (name -> settings after the command, e.g. "ok" or
    "fail, dedupe: {window: 1h}"); the mode is the first word."""
    lines = []
    for name, settings_ in queues.items():
        mode, _, rest = settings_.partition(",")
        extra = f", {rest.strip()}" if rest.strip() else ""
        lines.append(f"  {name}: {{command: [./h.py, {mode.strip()}]{extra}}}\n")
    return (
        "redis: {url: '{redis}'}\n"
        "defaults:\n"
        "  lease: {renew_every: 300ms, reclaim_after: 1s}\n"
        "  retry: {max_attempts: 3, backoff: 100ms, max_backoff: 200ms, jitter: 0}\n"
        "  max_deliveries: 3\n"
        "  concurrency: 4\n"
        "queues:\n" + "".join(lines)
    )


def six_queues() -> dict[str, str]:
    """ok, fail, retry, and the same three with a dedupe window."""
    plain = {mode: mode for mode in MODES}
    dedupe = {f"{mode}_dd": f"{mode}, dedupe: {{window: 1h}}" for mode in MODES}
    return plain | dedupe


# -- what happened ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sent:
    queue: str
    mode: str  # the queue's handler: ok, fail or retry
    entry_id: str
    fields: dict[bytes, bytes]

    def short(self) -> str:
        shown = {k[:20]: v[:20] for k, v in itertools.islice(self.fields.items(), 6)}
        more = f" +{len(self.fields) - 6} fields" if len(self.fields) > 6 else ""
        return f"{self.queue}/{self.entry_id} {shown}{more}"


@dataclass(frozen=True)
class Run:
    queue: str
    message_id: str
    job_id: bytes
    attempt: bytes
    stdin_len: int
    payload_bytes: int


def stream(queue: str) -> str:
    return f"jobd:{queue}"


def dead_stream(queue: str) -> str:
    return f"{{jobd:{queue}}}:dead"


def delayed(queue: str) -> str:
    return f"{{jobd:{queue}}}:delayed"


@dataclass
class Harness:
    r: redis.Redis
    ran: Path
    modes: dict[str, str]  # queue -> its handler's mode
    d: DaemonProcess

    @property
    def queues(self) -> list[str]:
        return list(self.modes)

    def send(self, batch: list[tuple[str, dict[bytes, bytes]]]) -> list[Sent]:
        pipe = self.r.pipeline(transaction=False)
        for queue, fields in batch:
            pipe.xadd(stream(queue), fields)
        ids = pipe.execute()
        return [
            Sent(queue, self.modes[queue], raw.decode(), fields)
            for (queue, fields), raw in zip(batch, ids, strict=True)
        ]

    def runs(self) -> list[Run]:
        if not self.ran.exists():
            return []
        out = []
        for line in self.ran.read_bytes().splitlines():
            queue, mid, job_hex, attempt, stdin_len, payload_bytes = line.split(b" ")
            job_id = b"" if job_hex == b"-" else bytes.fromhex(job_hex.decode())
            out.append(
                Run(
                    queue.decode(),
                    mid.decode(),
                    job_id,
                    attempt,
                    int(stdin_len),
                    int(payload_bytes),
                )
            )
        return out

    def dead(self, queue: str) -> list[dict[bytes, bytes]]:
        return [fields for _, fields in self.r.xrange(dead_stream(queue))]

    def drained(self) -> bool:
        """Each queue's group and delayed set read in one transaction: read apart, a retry moved
        from the delayed set to the stream between the two reads looked like neither."""
        for queue in self.queues:
            pipe = self.r.pipeline(transaction=True)
            pipe.xinfo_groups(stream(queue))
            pipe.zcard(delayed(queue))
            try:
                groups, waiting = pipe.execute()
                info = next(g for g in groups if g["name"] == b"jobd")
            except (redis.ResponseError, StopIteration):
                return False
            if info["lag"] != 0 or info["pending"] != 0 or waiting != 0:
                return False
        return True

    def settle(self, sent: list[Sent], timeout: float = SETTLE) -> None:
        """Wait until every queue is drained; fail with what is stuck, and whether the queues
        still move, if they are not by ``timeout``."""
        if poll(self.drained, timeout):
            return
        stuck = []
        for queue in self.queues:
            pend = []
            if pending_count(self.r, stream(queue)):
                pend = self.r.xpending_range(stream(queue), "jobd", "-", "+", 5)
            try:
                lag = group_info(self.r, stream(queue))["lag"]
            except (redis.ResponseError, StopIteration):
                lag = "no group"
            waiting = self.r.zcard(delayed(queue))
            if pend or lag or waiting:
                shown = [(p["message_id"].decode(), p["times_delivered"]) for p in pend]
                stuck.append(f"{queue}: pending {shown} lag {lag} delayed {waiting}")
        unsettled = self.unaccounted(sent)
        moving = self.probe()
        pytest.fail(
            f"not drained after {timeout}s: {'; '.join(stuck)}\n"
            f"entries neither run nor dead-lettered: {[s.short() for s in unsettled[:8]]}\n"
            f"a normal job enqueued now runs within 3 s on: {moving}\n"
            f"daemon alive: {self.d.proc.poll() is None}\n"
            f"daemon errors:\n{errors(self.d)}"
        )

    def unaccounted(self, sent: list[Sent]) -> list[Sent]:
        ran = {(run.queue, run.message_id) for run in self.runs()}
        dead = {
            (queue, rec.get(b"jobd_original_id", b"").decode())
            for queue in self.queues
            for rec in self.dead(queue)
        }
        return [s for s in sent if (s.queue, s.entry_id) not in ran | dead]

    def probe(self) -> dict[str, bool]:
        """Enqueue a normal job on each queue; which of them ran within 3 s."""
        probes = self.send([(q, {b"payload": b"probe", b"job_id": b"probe"}) for q in self.queues])
        poll(lambda: not self.unaccounted(probes), 3)
        missing = {s.queue for s in self.unaccounted(probes)}
        return {q: q not in missing for q in self.queues}

    def verify(self, sent: list[Sent]) -> list[str]:
        """What is wrong with how ``sent`` ended (the queues being drained)."""
        problems = []
        all_runs = self.runs()
        by_entry: dict[tuple[str, str], list[Run]] = {}
        for run in all_runs:
            by_entry.setdefault((run.queue, run.message_id), []).append(run)
        dead = {q: self.dead(q) for q in self.queues}
        twice = {k: len(v) for k, v in by_entry.items() if len(v) > 1}
        if twice:
            problems.append(f"deliveries run more than once (no fault was injected): {twice}")
        for run in all_runs:
            if run.stdin_len != run.payload_bytes:
                problems.append(
                    f"{run.queue}/{run.message_id}: read {run.stdin_len} bytes on stdin, "
                    f"JOBD_PAYLOAD_BYTES says {run.payload_bytes}"
                )
        for s in sent:
            runs_e = by_entry.get((s.queue, s.entry_id), [])
            dead_e = [
                rec for rec in dead[s.queue] if rec.get(b"jobd_original_id") == s.entry_id.encode()
            ]
            errors_e = [rec.get(b"jobd_error") for rec in dead_e]
            if not runs_e:
                if not dead_e:
                    problems.append(f"acknowledged unrun, no dead letter: {s.short()}")
                elif not all(errors_e):
                    problems.append(f"dead-lettered without jobd_error: {s.short()}")
                continue
            run = runs_e[0]
            payload = s.fields.get(b"payload")
            if payload is not None and run.stdin_len != len(payload):
                problems.append(f"stdin had {run.stdin_len} of {len(payload)} bytes: {s.short()}")
            want_id = expected_job_id(s)
            if want_id is not None and run.job_id != want_id:
                problems.append(f"JOBD_JOB_ID {run.job_id!r}, not {want_id!r}: {s.short()}")
            if s.mode == "fail":
                if errors_e != [b"exit"] or dead_e[0].get(b"jobd_exit_code") != b"65":
                    problems.append(f"exited 65 but dead letters are {errors_e}: {s.short()}")
            elif s.mode == "retry" and run.attempt == b"1":
                if dead_e:
                    problems.append(f"failed attempt 1 but dead-lettered {errors_e}: {s.short()}")
                again = [
                    r2
                    for r2 in all_runs
                    if r2.queue == s.queue and r2.job_id == run.job_id and r2.attempt == b"2"
                ]
                dead_j = [rec for rec in dead[s.queue] if rec.get(b"jobd_job_id") == run.job_id]
                if not again and not dead_j:
                    said = [
                        line[:300]
                        for line in self.d.log().splitlines()
                        if f"job={os.fsdecode(run.job_id)} " in line and "attempt=1" not in line
                    ]
                    others = [
                        {k: v[:100] for k, v in rec.items() if k.startswith(b"jobd_")}
                        for rec in dead[s.queue]
                        if b"jobd_original_id" not in rec
                    ]
                    problems.append(
                        f"failed attempt 1, then neither ran attempt 2 nor has a dead letter "
                        f"with its job id: {s.short()}; the daemon said since: {said[:5]}; "
                        f"dead letters of no entry on {s.queue}: {others[:3]}"
                    )
            elif dead_e:
                problems.append(f"exited 0 but dead-lettered {errors_e}: {s.short()}")
        return problems

    def check(self, sent: list[Sent], timeout: float = SETTLE) -> None:
        """Settled, each entry ended as it should, the daemon alive and without tracebacks."""
        self.settle(sent, timeout)
        problems = self.verify(sent)
        if self.d.proc.poll() is not None:
            problems.append(f"the daemon died with {self.d.proc.returncode}")
        if "Traceback" in self.d.log():
            problems.append(f"the daemon logged a traceback:\n{errors(self.d)}")
        assert not problems, "\n".join(problems[:25])

    def keeps_moving(self) -> None:
        """A normal job on every queue still ends as its handler says."""
        self.check(self.send([(q, {b"payload": b"normal"}) for q in self.queues]))


def expected_job_id(s: Sent) -> bytes | None:
    """JOBD_JOB_ID as the README says: the producer's job_id field (unless empty or with a NUL
    byte: then it falls back), else the stream id; None where the README does not say (a
    producer's jobd_job_id, a reserved field)."""
    job_id = s.fields.get(b"job_id")
    if job_id and b"\0" not in job_id:
        return job_id
    if b"jobd_job_id" in s.fields:
        return None
    return s.entry_id.encode()


def poll(predicate: Callable[[], object], timeout: float) -> bool:
    """True once ``predicate`` is; False at the deadline."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def errors(d: DaemonProcess, limit: int = 30) -> str:
    keep = ("ERROR", "Traceback", "Error", "error:", "  File ", "WARNING")
    lines = [line[:300] for line in d.log().splitlines() if any(k in line for k in keep)]
    return "\n".join(lines[:limit])


def start(r, write_config, script, daemon: Daemon, tmp_path: Path, queues: dict[str, str]):
    ran = handler(script, tmp_path)
    d = daemon(write_config(config(queues)))
    modes = {name: settings_.split(",", 1)[0].strip() for name, settings_ in queues.items()}
    return Harness(r, ran, modes, d)


def summary(h: Harness, label: str, sent: list[Sent] | int) -> None:
    count = sent if isinstance(sent, int) else len(sent)
    errors_ = Counter(rec.get(b"jobd_error", b"?").decode() for q in h.queues for rec in h.dead(q))
    print(f"{label}: {count} entries, {len(h.runs())} runs, dead letters {dict(errors_)}")


# -- the tests ------------------------------------------------------------------------------------

RESERVED_GARBAGE: list[dict[bytes, bytes]] = [
    {b"payload": b"a", b"jobd_attempt": b"abc"},
    {b"payload": b"b", b"jobd_job_id": b""},
    {b"payload": b"c", b"jobd_unique": b"\xff\x00odd"},
    {b"payload": b"d", b"jobd_unique": b"", b"job_id": b"unique-empty"},
    {b"payload": b"e", b"jobd_attempt": b"-1", b"jobd_job_id": b"\x00"},
    {b"payload": b"f", b"jobd_attempt": b"2", b"job_id": b""},
    {b"payload": b"g", b"jobd_error": b"malformed", b"jobd_original_id": b"0-1"},
    {b"jobd_attempt": b"9" * 30},  # only reserved fields: stdin is a JSON object
    {b"jobd_job_id": b"only-reserved", b"jobd_unique": b"1", b"jobd_attempt": b"1.5"},
    {b"payload": b"h", b"job_id": b"plain-id", b"jobd_attempt": b"0x10"},
]


def test_garbage_in_reserved_fields(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """jobd_attempt=abc, an empty jobd_job_id, odd jobd_unique values… with UTF-8 job ids only,
    on ok / fail / retry queues with and without a dedupe window."""
    h = start(r, write_config, script, daemon, tmp_path, six_queues())
    sent = h.send([(q, dict(fields)) for q in h.queues for fields in RESERVED_GARBAGE])
    h.check(sent)
    summary(h, "reserved garbage", sent)
    h.keeps_moving()


NON_UTF8: list[dict[bytes, bytes]] = [
    {b"payload": b"p1", b"job_id": b"caf\xe9"},
    {b"payload": b"p2", b"job_id": b"\xff\xfe"},
    {b"payload": b"p3", b"job_id": b"\x80\n\x1b[0m \t"},
    {b"payload": b"p4", b"job_id": b"\xed\xa0\x80surrogate"},
    {b"payload": b"p5", b"jobd_job_id": b"\xc3\x28"},
    {b"payload": b"p6", b"job_id": b"u\xff", b"jobd_unique": b"1"},
    {b"payload": b"p7", b"job_id": b"ascii-neighbour"},
]


@pytest.mark.parametrize("dedupe", [False, True], ids=["plain", "dedupe"])
def test_non_utf8_job_ids(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path, dedupe: bool
) -> None:
    """A job id is any bytes: it reaches the handler as those bytes, and the entry is settled
    (acked, dead-lettered, retried) like any other, with and without a dedupe window."""
    queues = {k: v for k, v in six_queues().items() if k.endswith("_dd") == dedupe}
    h = start(r, write_config, script, daemon, tmp_path, queues)
    sent = h.send([(q, dict(fields)) for q in h.queues for fields in NON_UTF8])
    h.check(sent)
    summary(h, f"non-UTF-8 job ids ({'dedupe' if dedupe else 'plain'})", sent)
    h.keeps_moving()


SPECIAL = [
    b"", b"\x00", b"\xff\xfe", b"\xc3\x28", b"a\nb", b"\x1b[31mred\x1b[0m", b"caf\xe9",
    b"\r\n", b"$-1\r\n", b"*1\r\n$1\r\n", b"%s%n", b"\\x00", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
    b"=", b"PATH", b"\x00" * 3, b"'\"`$(id)",
]  # fmt: skip
GARBAGE = [
    b"abc", b"", b"-3", b"0", b"1", b"2", b"9" * 30, b"1.5", b" 2", b"2\x00", b"\xff",
    b"0x10", b"+1", b"1_0",
]  # fmt: skip
RESERVED = [
    b"payload", b"job_id", b"jobd_job_id", b"jobd_attempt", b"jobd_unique", b"jobd_error",
    b"jobd_original_id", b"jobd_", b"JOBD_JOB_ID",
]  # fmt: skip
hostile_bytes = st.one_of(st.binary(max_size=24), st.sampled_from(SPECIAL))
names = st.one_of(st.sampled_from(RESERVED), hostile_bytes)
values = st.one_of(hostile_bytes, st.sampled_from(GARBAGE))
# The reserved fields, each present or not, with hostile or garbage values; then up to 6 fields
# of any bytes (which may set a reserved name too). At least one field: XADD needs one.
reserved = st.fixed_dictionaries(
    {},
    optional={
        b"payload": hostile_bytes,
        b"job_id": hostile_bytes,
        b"jobd_job_id": values,
        b"jobd_attempt": st.sampled_from(GARBAGE),
        b"jobd_unique": values,
    },
)
entries = st.tuples(reserved, st.dictionaries(names, values, max_size=6)).map(
    lambda pair: {**pair[1], **pair[0]} or {b"payload": b""}
)


def unique_ids(fields: dict[bytes, bytes], serial: int) -> dict[bytes, bytes]:
    """Make a non-empty job_id / jobd_job_id unique in the test (a suffix; still any bytes), so
    that a dedupe window never rightly suppresses one of these entries."""
    out = dict(fields)
    for name in (b"job_id", b"jobd_job_id"):
        if out.get(name):
            out[name] += b"#%d" % serial
    return out


def test_hypothesis_hostile_entries(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Batches of generated entries (any bytes as names and values, 1..8 fields, reserved names
    with garbage) over the six queues of one daemon; each batch must settle as it should."""
    h = start(r, write_config, script, daemon, tmp_path, six_queues())
    serial = itertools.count()
    batches = sent_total = 0

    @settings(
        max_examples=8,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: each example takes seconds
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(st.tuples(st.sampled_from(h.queues), entries), min_size=6, max_size=18))
    def batch_settles(batch: list[tuple[str, dict[bytes, bytes]]]) -> None:
        nonlocal batches, sent_total
        batches += 1
        sent_total += len(batch)
        sent = h.send([(q, unique_ids(fields, next(serial))) for q, fields in batch])
        h.check(sent)

    batch_settles()
    summary(h, f"hypothesis ({batches} batches)", sent_total)
    h.keeps_moving()


def test_wide_entries(r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path) -> None:
    """Entries of 1000, 2000 and 10000 fields (more than Lua's unpack takes at once): run, or
    dead-lettered with a jobd_error and, as the README says of every record, the job's own
    fields; never stuck in the PEL or the delayed set."""
    h = start(r, write_config, script, daemon, tmp_path, {m: m for m in MODES})
    batch = []
    for width in (1000, 2000, 10000):
        for queue in h.queues:
            fields = {b"f%d" % i: b"v%d" % i for i in range(width - 2)}
            fields |= {b"payload": b"wide", b"job_id": b"wide-%d" % width}
            batch.append((queue, fields))
    sent = h.send(batch)
    h.check(sent, timeout=12)
    by_id = {(s.queue, s.entry_id.encode()): s for s in sent}
    ran = {(run.queue, run.message_id.encode()) for run in h.runs()}
    for queue in h.queues:
        for record in h.dead(queue):
            key = (queue, record[b"jobd_original_id"])
            s = by_id[key]
            # A job that ran keeps every field in its record (README); one too wide to run
            # may keep only its payload and job_id (jobd/store/dead_letter.py), never less.
            keep = s.fields if key in ran else {k: s.fields[k] for k in (b"payload", b"job_id")}
            lost = [k for k, v in keep.items() if record.get(k) != v]
            assert not lost, (
                f"{queue}: the dead letter of a {len(s.fields)}-field entry "
                f"({record[b'jobd_error']!r}) lacks {len(lost)} of its fields, e.g. {lost[:3]}"
            )
    summary(h, "wide entries", sent)
    h.keeps_moving()


def test_job_ids_cannot_forge_log_lines(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Anyone who can XADD chooses a job id, and every job line of the (text) log carries it: a
    newline or a terminal escape in it must not reach the log raw (a forged line, a rewritten
    terminal)."""
    h = start(r, write_config, script, daemon, tmp_path, {"ok": "ok", "fail": "fail"})
    forged = b"2026-01-01 00:00:00,000 ERROR jobd.forged: FORGED"
    ids = [b"inject\n" + forged, b"esc\x1b]0;owned\x07\x1b[2J", b"cr\rFORGED-CR"]
    sent = h.send([(q, {b"payload": b"x", b"job_id": i}) for q in h.queues for i in ids])
    h.check(sent)
    log = h.d.log_path.read_bytes()
    assert not any(line.startswith(forged) for line in log.splitlines()), (
        "a producer's job id forged a line of the daemon's log"
    )
    assert b"\x1b" not in log, "a producer's terminal escape reached the daemon's log raw"
    assert b"\r" not in log, "a producer's carriage return reached the daemon's log raw"


def test_payload_of_30_mib_around_max_payload(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """30 MiB payloads: above max_payload, dead-lettered as malformed unrun; below it, run with
    every byte on stdin, and dead-lettered whole when the handler fails."""
    # A lease of 10 s: a 30 MiB read takes long enough on a loaded machine that a start check
    # under the harness's 1 s reclaim_after hands the entry back unstarted, again and again
    # (rightly: the daemon says its round trip is too long for that lease).
    lease = "lease: {renew_every: 1s, reclaim_after: 10s}"
    queues = {
        "small": "ok, max_payload: 8MiB",
        "big": f"ok, max_payload: 64MiB, {lease}",
        "bigfail": f"fail, max_payload: 64MiB, {lease}",
    }
    h = start(r, write_config, script, daemon, tmp_path, queues)
    size = 30 * 2**20
    payload = bytes(range(256)) * (size // 256)
    sent = h.send([(q, {b"payload": payload, b"job_id": b"big-" + q.encode()}) for q in queues])
    h.check(sent, timeout=20)
    ran = {run.queue: run for run in h.runs()}
    assert "small" not in ran, "a payload above max_payload never runs"
    [record] = h.dead("small")
    assert record[b"jobd_error"] == b"malformed"
    assert ran["big"].stdin_len == size
    [record] = h.dead("bigfail")
    assert (record[b"jobd_error"], len(record[b"payload"])) == (b"exit", size)
    summary(h, "30 MiB payloads", sent)
    h.keeps_moving()


def test_over_long_job_ids_are_dead_lettered_unrun(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """A job id longer than jobd.job.MAX_JOB_ID (1024 bytes) would be copied into every log
    line, event and history record of its job: the entry is dead-lettered unrun as malformed,
    under its stream id, with only a prefix of the id in its record and the log; one of exactly
    1024 bytes runs. With and without a dedupe window (which reads job ids before the start)."""
    queues = {"ok": "ok", "ok_dd": "ok, dedupe: {window: 1h}"}
    h = start(r, write_config, script, daemon, tmp_path, queues)
    longest = b"k" * 1024
    over = [(b"job_id", b"L" * 1025), (b"job_id", b"M" * (8 << 20)), (b"jobd_job_id", b"R" * 2000)]
    sent = h.send([(q, {b"payload": b"p", name: value}) for q in h.queues for name, value in over])
    fine = h.send([("ok", {b"payload": b"p", b"job_id": longest})])
    h.check(sent + fine)
    assert [run.job_id for run in h.runs()] == [longest]
    for s in sent:
        [record] = [d for d in h.dead(s.queue) if d[b"jobd_original_id"] == s.entry_id.encode()]
        assert record[b"jobd_error"] == b"malformed"
        assert b"a job id has at most 1024" in record[b"jobd_stderr"]
        assert record[b"jobd_job_id"] == s.entry_id.encode()
        if value := s.fields.get(b"job_id"):
            assert record[b"job_id"] == value[:1024]
            assert record[b"jobd_clipped"] == b"job_id %d" % len(value)
    for queue in h.queues:
        history = r.hkeys(f"{{jobd:{queue}}}:history")
        assert max(map(len, history)) <= 1024, "a history record kept under an over-long id"
        events = [v for _, e in r.xrange(f"{{jobd:{queue}}}:events") for v in e.values()]
        assert max(map(len, events)) < 4096, "an event holds an over-long job id"
    assert h.d.log_path.stat().st_size < 500_000, "the log holds the over-long job ids"
    h.keeps_moving()


def test_enqueue_refuses_an_over_long_job_id_and_a_clipped_record_is_not_requeued(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """`jobd enqueue --job-id` refuses an id longer than 1024 bytes (exit 2, nothing added); a
    dead letter whose values were clipped (a malformed job's) is left in place by `dlq requeue`:
    only a prefix of its job is left."""
    h = start(r, write_config, script, daemon, tmp_path, {"ok": "ok"})
    c = str(tmp_path / "jobd.yaml")
    refused = jobd_cli("enqueue", "-c", c, "ok", "x", "--job-id", "j" * 1025)
    assert refused.returncode == 2, refused.stderr
    assert b"at most 1024 bytes" in refused.stderr and b"j" * 100 not in refused.stderr
    assert jobd_cli("enqueue", "-c", c, "ok", "x", "--job-id", "j" * 1024).returncode == 0
    h.send([("ok", {b"payload": b"p", b"job_id": b"L" * 5000})])
    wait_until(lambda: len(h.dead("ok")) == 1)
    [(record_id, record)] = r.xrange(dead_stream("ok"))
    assert record[b"jobd_clipped"] == b"job_id 5000"
    requeued = jobd_cli("dlq", "-c", c, "ok", "requeue", record_id.decode())
    assert b"clipped" in requeued.stdout + requeued.stderr, requeued
    assert r.xlen(dead_stream("ok")) == 1


# Job ids that look like "victim" to a reader, or to the JSON log's tag parser: a no-break space,
# a zero-width space, a line separator, a bidi override, a C1 newline (NEL), an en quad.
LOOKALIKES = ["victim\u00a0attempt=1 exit 0", "victim\u200b", "victim\u2028forged", "victim\u202e",
              "victim\x85forged", "victim\u2000x"]  # fmt: skip


def test_job_ids_with_unicode_spaces_cannot_pass_for_another_job(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """A job id with a Unicode space or format character (Zs, Zl, Zp, Cf) or a C1 control is
    escaped wherever the log shows it: no line of the text log, and no JSON log line's `job`
    field, names the job "victim" (it logged `job=victim\u00a0…`, which the JSON log parsed as
    job "victim")."""
    ran = handler(script, tmp_path)
    text_daemon = daemon(write_config(config({"t": "ok"}), "text.yaml"))
    json_log = tmp_path / "json.log"
    with open(json_log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobd", "run", str(write_config(config({"j": "ok"}), "j.yaml")),
             "--log-format", "json", "--log-level", "DEBUG"],
            stderr=out,
        )  # fmt: skip
        try:
            wait_until(lambda: b"jobd running" in json_log.read_bytes())
            for q in ("t", "j"):
                for jid in LOOKALIKES:
                    r.xadd(stream(q), {"payload": "x", "job_id": jid.encode()})
            wait_until(lambda: ran.exists() and len(ran.read_bytes().splitlines()) == 12)
            wait_until(lambda: json_log.read_bytes().count(b" exit 0 after ") >= 6)
            text_daemon.wait_log("exit 0 after")
            wait_until(lambda: text_daemon.log().count(" exit 0 after ") >= 6)
        finally:
            proc.terminate()
            proc.wait(30)
    jobs = {orjson.loads(line).get("job") for line in json_log.read_bytes().splitlines()}
    assert "victim" not in jobs, "a hostile job id passed for job 'victim' in the JSON log"
    assert "victim\\xa0attempt=1\\x20exit\\x200" in jobs and "victim\\u202e" in jobs
    text = text_daemon.log_path.read_bytes().decode()
    for jid in LOOKALIKES:
        raw = "job=" + jid
        assert raw not in text, f"the job id {jid!r} reached the text log unescaped"
    assert "job=victim\\u200b attempt=1" in text and "job=victim\\x85forged attempt=1" in text


def vm_hwm(pid: int) -> int:
    """The process's peak resident memory (VmHWM), bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_an_entry_far_above_max_payload_is_never_read_into_the_daemon(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """64 MiB entries against max_payload 1MiB: each is dead-lettered as malformed, its record
    holding a 1 KiB prefix and the size, and the daemon's peak memory does not grow by the
    entry's size, whether the entry came while its reader waited (XREAD BLOCK), was there when
    it read, or is taken over from a dead consumer (XAUTOCLAIM); on a queue with priority levels
    too. (max_payload was checked once the whole entry was in the daemon: 256 MiB entries took
    it to 1 GB.)"""
    queues = {"ok": "ok, max_payload: 1MiB", "pq": "ok, max_payload: 1MiB, priorities: [hi, lo]"}
    h = start(r, write_config, script, daemon, tmp_path, queues)
    h.keeps_moving()
    ran = len(h.runs())
    before = vm_hwm(h.d.proc.pid)
    size = 64 << 20
    big = b"\xab" * size
    r.xadd(stream("ok"), {b"payload": big, b"job_id": b"waited-for"})  # the reader was waiting
    wait_until(lambda: len(h.dead("ok")) == 1, timeout=20)
    grown = vm_hwm(h.d.proc.pid) - before
    assert grown < size // 4, f"the daemon's peak memory grew by {grown >> 20} MiB"
    r.xadd(stream("ok"), {b"payload": b"x", b"filler": big[: 2 << 20]})  # a little too large
    wait_until(lambda: len(h.dead("ok")) == 2, timeout=20)
    pipe = r.pipeline(transaction=True)  # read at once by a consumer that then dies
    pipe.xadd(stream("ok"), {b"payload": big, b"job_id": b"claimed"})
    pipe.xreadgroup("jobd", "ghost", {stream("ok"): ">"}, count=1)
    assert pipe.execute()[1], "the ghost consumer holds it"
    r.xadd("{jobd:pq}:priority:hi", {b"payload": big, b"job_id": b"high"})
    wait_until(lambda: len(h.dead("ok")) == 3 and len(h.dead("pq")) == 1, timeout=30)
    grown = vm_hwm(h.d.proc.pid) - before
    print(f"peak memory grew by {grown / 2**20:.1f} MiB for four 64 MiB entries")
    assert grown < size // 4, f"the daemon's peak memory grew by {grown >> 20} MiB"
    records = [rec for q in h.queues for rec in h.dead(q)]
    for rec in records:
        assert rec[b"jobd_error"] == b"malformed", rec.get(b"jobd_stderr")
        assert b"not read" in rec[b"jobd_stderr"], rec[b"jobd_stderr"]
        assert len(rec[b"payload"]) <= 1024
    clipped = sorted(rec[b"jobd_clipped"] for rec in records)
    assert clipped == [b"filler %d" % (2 << 20), *[b"payload %d" % size] * 3], clipped
    assert [rec.get(b"job_id") for rec in records] == [b"waited-for", None, b"claimed", b"high"]
    assert len(h.runs()) == ran, "none of them ran"
    h.keeps_moving()


def test_entries_of_a_million_empty_fields_are_never_read_and_never_run(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Four entries of 1M (empty, empty) pairs, read in one batch (the queue paused while they
    are added, then resumed): they hold no byte of names and values, but more than MAX_FIELDS
    fields, so the read script hands each over as a stand-in (lua/lib/jobs.lua sized), and each
    is dead-lettered as malformed unrun. (Passed whole, 2M values a reply, they took the
    daemon's peak memory up by ~76 MiB, where 64 MiB entries take it up by 0.3 MiB; and, their
    names one dict key, each ran.)"""
    ran = tmp_path / "ran"
    script("h.sh", f"#!/bin/sh\ncat >/dev/null\necho ran >> {ran}\n")
    config = write_config(queue_config("[./h.sh]", max_payload="64KiB", concurrency=4))
    d = daemon(config)
    r.xadd("jobd:q", {"payload": "warm-up"})
    wait_until(lambda: ran.exists(), what="the warm-up job")
    before = vm_hwm(d.proc.pid)
    r.hset("{jobd:q}:paused", mapping={"since": str(int(time.time() * 1000)), "by": "test"})
    time.sleep(1.5)  # the readers see the pause (twice a second) before the entries come
    for _ in range(4):
        last = r.execute_command("XADD", "jobd:q", "*", *([b""] * 2_000_000))
    r.delete("{jobd:q}:paused")

    def settled() -> bool:
        try:
            [group] = r.xinfo_groups("jobd:q")
        except redis.ResponseError as exc:  # BUSY: a read script still runs (a loaded machine)
            if "BUSY" not in str(exc):
                raise
            return False
        return group["last-delivered-id"] == last and group["pending"] == 0

    wait_until(settled, timeout=60, what="the four wide entries read and settled")
    grown = vm_hwm(d.proc.pid) - before
    runs = ran.read_text().split()
    dead = r.xrange("{jobd:q}:dead")
    print(f"peak memory +{grown / 2**20:.1f} MiB; runs {len(runs)}; dead letters {len(dead)}")
    assert grown < 16 << 20, f"the daemon's peak memory grew by {grown >> 20} MiB in one read"
    assert len(runs) == 1 and len(dead) == 4, (
        f"entries of 2M fields: {len(runs) - 1} run, {len(dead)} dead-lettered (malformed)"
    )
    for _, record in dead:
        assert record[b"jobd_error"] == b"malformed", record
        assert b"an entry of 1000000 fields, more than 1000: not read" in record[b"jobd_stderr"]


def test_the_daemon_counts_an_entrys_width_as_it_came() -> None:
    """The daemon's own guard behind the read scripts' bound: an entry of 1001 pairs of one
    name (one dict key) handed over whole, as no script does (lua/lib/jobs.lua sized), is
    malformed for its width, not a job of one field; one of 1000 pairs is not."""
    from jobd.job import Job
    from jobd.store.reading import _entry

    wide = Job.from_entry("q", b"1-1", _entry([b"f", b""] * 1001))
    assert wide.malformed == "an entry of 1001 fields, more than 1000: not read"
    assert Job.from_entry("q", b"1-1", _entry([b"f", b""] * 1000)).malformed == ""
