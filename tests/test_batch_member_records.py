"""A batch member's records and events name its batch however it ends (review 35o): one that
ends without a run (held with ``--after`` and cancelled, delayed and cancelled, cancelled as it
became due, deduped) had no ``batch`` in any of its records, so ``jobd job`` did not show
``batch: B`` (``--json``: ``"batch": null``) and its ``jobd events`` lines had no ``batch=``,
though the batch counts its end.

docs/workflows.md: "A member's records carry `batch`, and `jobd job` shows `batch: ID`". Only
the ends told by an attempt's note (store/notes.py links) put it there; the records written in
Lua for a job that never ran carried none. Now every writer links a record through one helper,
lua/lib/jobs.lua ``linked`` (from the job's jobd_batch), which drops a jobd_batch jobd would not
write (over 800 bytes: someone's XADD), as store/notes.py does."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli, wait_until
from test_after_batches import RUNS, runs

from jobd.config import load
from jobd.job import Job
from jobd.outcome import Outcome, Verb
from jobd.store import notes
from jobd.store.delayed import schedule_call
from jobd.store.store import Store

CONFIG = (
    "redis: {url: '{redis}'}\nqueues:\n"
    "  a:\n    command: [/bin/true]\n"
    "  cb:\n    command: [/bin/true]\n"
)


def shown(c: str, job: str) -> tuple[object, bool, list[str]]:
    """``jobd job``'s batch (--json), whether its text says 'batch: B', and its records, each
    with the batch it names ("done", not "done B": one that names none)."""
    got = json.loads(jobd_cli("job", "-c", c, "a", job, "--json").stdout)
    text = jobd_cli("job", "-c", c, "a", job).stdout.decode()
    records = [" ".join((x["event"], x.get("batch", "-"))) for x in got["records"]]
    return got["batch"], "batch: B" in text, records


def events(c: str) -> list[dict]:
    """The queue's events of its jobs (not the operator's `cancel`)."""
    out = jobd_cli("events", "-c", c, "a", "--json", "--count", "100")
    assert out.returncode == 0, out.stderr
    found = [json.loads(line) for line in out.stdout.decode().splitlines() if line]
    return [e for e in found if e.get("event") != "cancel"]


def test_a_member_ended_unrun_is_shown_in_its_batch(r: redis.Redis, write_config) -> None:
    c = str(write_config(CONFIG))
    for job, extra in (("held", ("--after", "never")), ("late", ("--delay", "1h"))):
        out = jobd_cli("enqueue", "-c", c, "a", "x", "--job-id", job, *extra, "--batch", "B",
                       "--on-complete", "cb")  # fmt: skip
        assert out.returncode == 0, out.stderr
    out = jobd_cli("cancel", "-c", c, "a", "held", "late")
    assert out.returncode == 0, out.stderr
    state = json.loads(jobd_cli("batch", "-c", c, "B", "--json").stdout)
    assert (state["total"], state["failed"]) == (2, 2), state  # the batch counts both ends
    got = {job: shown(c, job) for job in ("held", "late")}
    assert got == {
        "held": ("B", True, ["waiting B", "cancelled B"]),
        "late": ("B", True, ["scheduled B", "cancelled B"]),
    }, f"jobd job of the batch's members (batch, 'batch: B' shown, records): {got}"
    told = {(e.get("event"), e.get("job")): e.get("batch") for e in events(c)}
    assert told == {("waiting", "held"): "B", ("cancelled", "held"): "B",
                    ("cancelled", "late"): "B"}, told  # fmt: skip


def test_a_member_cancelled_as_it_became_due_is_shown_in_its_batch(
    r: redis.Redis, write_config
) -> None:
    """promote.lua removes a due job whose job id `jobd cancel` marked: recorded cancelled."""
    c = str(write_config(CONFIG))
    out = jobd_cli("enqueue", "-c", c, "a", "x", "--job-id", "due", "--delay", "300ms",
                   "--batch", "B", "--on-complete", "cb")  # fmt: skip
    assert out.returncode == 0, out.stderr
    store, q = Store(r), load(c).queues["a"]
    (level,) = q.all_levels()
    r.xgroup_create(q.stream, "jobd", id="0", mkstream=True)
    assert [f.where for f in store.cancel(level, ["due"], 1000, "t@h")] == ["marked"]
    wait_until(lambda: store.promote(q, 100, 1000) and r.zcard(q.keys.delayed) == 0, 10,
               what="the job due, removed as cancelled")  # fmt: skip
    assert shown(c, "due") == ("B", True, ["scheduled B", "cancelled B"])
    assert [e.get("batch") for e in events(c) if e.get("event") == "cancelled"] == ["B"]


def test_a_member_deduped_is_shown_in_its_batch(
    r: redis.Redis, write_config, script, daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    runs_sh = script("runs.sh", RUNS)
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  a:\n    command: [{runs_sh}]\n    dedupe: {{window: 1h}}\n"
        "  cb:\n    command: [/bin/true]\n"
    )
    c = str(cfg)
    daemon(cfg)
    assert jobd_cli("enqueue", "-c", c, "a", "x", "--job-id", "x").returncode == 0
    wait_until(lambda: runs(tmp_path) == ["x"], what="x done")
    out = jobd_cli("enqueue", "-c", c, "a", "x", "--job-id", "x", "--batch", "B",
                   "--on-complete", "cb")  # fmt: skip
    assert out.returncode == 0, out.stderr
    wait_until(lambda: len(shown(c, "x")[2]) == 2, what="the second x deduped")
    assert shown(c, "x") == ("B", True, ["done -", "deduped B"])  # the first x: no member
    assert [e.get("batch") for e in events(c) if e.get("event") == "deduped"] == ["B"]


def test_a_jobd_batch_jobd_would_not_write_is_left_out(r: redis.Redis, write_config) -> None:
    """A jobd_batch over 800 bytes (someone's XADD; check_batch_id allows 200 characters) is in
    no record nor event: the Lua writers (cancel_delayed.lua here) and an attempt's note alike."""
    c = str(write_config(CONFIG))
    q = load(c).queues["a"]
    hostile = {b"payload": b"x", b"job_id": b"evil", b"jobd_batch": b"E" * 5000}
    keys, args = schedule_call(q, hostile, "+3600000", to_stream=True)
    Store(r).scripts.schedule(keys=keys, args=args)
    assert jobd_cli("cancel", "-c", c, "a", "evil").returncode == 0
    got = json.loads(jobd_cli("job", "-c", c, "a", "evil", "--json").stdout)
    assert (got["batch"], [x["event"] for x in got["records"]]) == (None, ["cancelled"]), got
    assert "batch" not in got["records"][0], got
    assert [e.get("batch") for e in events(c)] == [None]
    job = Job.from_entry("a", b"1-0", hostile)
    record = json.loads(notes.note(Outcome(Verb.ACK, q, job), "me")[3])
    assert "batch" not in record
    fine = {**hostile, b"jobd_batch": b"B", b"jobd_batch_incarnation": b"17"}
    record = json.loads(
        notes.note(Outcome(Verb.ACK, q, Job.from_entry("a", b"1-0", fine)), "me")[3]
    )
    assert (record["batch"], record["batch_incarnation"]) == ("B", "17")


def test_a_member_of_an_expired_batch_is_not_pointed_at_a_later_one(
    r: redis.Redis, write_config
) -> None:
    """Its records say which batch of the id it was a member of (``batch_incarnation``):
    `jobd job` points at `jobd batch ID` only while that batch is the one of the id now."""
    c = str(write_config(CONFIG))
    out = jobd_cli("enqueue", "-c", c, "a", "x", "--job-id", "late", "--delay", "1h",
                   "--batch", "B", "--on-complete", "cb")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert jobd_cli("cancel", "-c", c, "a", "late").returncode == 0
    got = json.loads(jobd_cli("job", "-c", c, "a", "late", "--json").stdout)
    said = {x.get("batch_incarnation") for x in got["records"]}
    assert len(said) == 1 and said.pop().isdigit(), got["records"]

    def pointed() -> set[str]:
        text = jobd_cli("job", "-c", c, "a", "late").stdout.decode()
        return {line.strip() for line in text.splitlines() if "batch:" in line}

    assert pointed() == {"batch: B (jobd batch B)"}
    r.delete("{jobd:batch:B}", "{jobd:batch:B}:members", "{jobd:batch:B}:adders")  # expired
    assert pointed() == {"batch: B (its batch expired: no batch of this id now)"}
    out = jobd_cli("enqueue", "-c", c, "a", "y", "--batch", "B", "--on-complete", "cb")
    assert out.returncode == 0, out.stderr
    assert pointed() == {"batch: B (an earlier batch of this id: `jobd batch` shows a later one)"}
