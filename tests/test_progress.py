"""Where what a handler tells of itself shows (issue 34): its progress and status reach its
job's active record with the lease renewal (``jobd job``: ``running.progress``,
``running.status``; ``jobd status``), its attempt's history record keeps the last of them, and a
handler whose lease was lost changes nothing of the new owner's record. Real daemons, real
handlers."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import redis
from support import DaemonProcess, acked_all, free_port, jobd_cli, queue_config, wait_until

from jobd.config import load
from jobd.daemon.lease import deadline_ms
from jobd.store.leases import Shown
from jobd.store.store import Store

Daemon = Callable[..., DaemonProcess]
ROOT = Path(__file__).resolve().parent.parent
JOBD = f"{sys.executable} -m jobd"  # as a handler runs it: this tree's jobd
ENV = json.dumps({"PYTHONPATH": str(ROOT)})
LEASE = "{renew_every: 300ms, reclaim_after: 3s}"


def job_json(config: Path, job_id: str) -> dict[str, Any]:
    out = jobd_cli("job", "-c", str(config), "q", job_id, "--json")
    assert out.stdout, out.stderr  # exit 3 while it is not known yet: a view all the same
    return json.loads(out.stdout)


def running_told(config: Path, job_id: str) -> dict[str, Any] | None:
    """The job's running view once it shows a status: None until then."""
    running = job_json(config, job_id).get("running")
    return running if running and running.get("status") is not None else None


def test_progress_and_status_show_while_it_runs_and_stay_in_its_history(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script(
        "h.sh",
        f"""
        #!/bin/sh
        {JOBD} notify --progress 42 --status "half way"
        while [ ! -e {tmp_path}/go ]; do sleep 0.05; done
        """,
    )
    config = write_config(queue_config("[./h.sh]", env=ENV, lease=LEASE))
    daemon(config)
    r.xadd("jobd:q", {"payload": "", "job_id": "a"})
    running = wait_until(lambda: running_told(config, "a"), what="running.status")
    assert running["progress"] == 42 and running["status"] == "half way"
    text = jobd_cli("job", "-c", str(config), "q", "a").stdout.decode()
    assert "42% done, status: half way" in text
    status = jobd_cli("status", "-c", str(config)).stdout.decode()
    assert "job a" in status and "42%" in status and "half way" in status
    (tmp_path / "go").touch()
    wait_until(lambda: acked_all(r, "jobd:q", 1), what="the job done")
    view = job_json(config, "a")
    assert view["running"] is None
    (done,) = [x for x in view["records"] if x["event"] == "done"]
    assert done["progress"] == 42 and done["status"] == "half way"


# A Python handler on a raw AF_UNIX datagram socket, no library: tells a status that is not
# UTF-8 and its progress, then more, each time once the test says so.
RAW = """\
#!{python}
import os, socket, sys, time
address = os.environ["NOTIFY_SOCKET"]
address = "\\0" + address[1:] if address.startswith("@") else address
folder = sys.argv[1]

def wait_for(name):
    while not os.path.exists(os.path.join(folder, name)):
        time.sleep(0.05)

with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
    s.sendto(b"STATUS=caf\\xe9 au lait\\nX_JOBD_PROGRESS=12.5", address)
    wait_for("more")
    s.sendto(b"X_JOBD_PROGRESS=80\\nSTATUS=nearly", address)
    wait_for("go")
"""


def test_a_python_handler_on_a_raw_socket_is_seen_by_jobd_job_json_while_it_runs(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """What it tells reaches ``running`` while it runs, and what it tells later replaces it
    (at most a renewal later); a status that is not UTF-8 is kept and shown escaped, in the
    JSON, the text and its history record."""
    script("raw.py", RAW.format(python=sys.executable))
    config = write_config(queue_config(f"[./raw.py, {tmp_path}]", lease=LEASE))
    daemon(config)
    r.xadd("jobd:q", {"payload": "", "job_id": "py"})
    running = wait_until(lambda: running_told(config, "py"), what="running.status")
    assert (running["progress"], running["status"]) == (12.5, "caf\\xe9 au lait")
    text = jobd_cli("job", "-c", str(config), "q", "py").stdout.decode()
    assert "12.5% done, status: caf\\xe9 au lait" in text, text
    (tmp_path / "more").touch()
    running = wait_until(
        lambda: (x := running_told(config, "py")) and x["status"] == "nearly" and x,
        what="the second message shown",
    )
    assert running["progress"] == 80
    (tmp_path / "go").touch()
    wait_until(lambda: acked_all(r, "jobd:q", 1), what="the job done")
    (done,) = [x for x in job_json(config, "py")["records"] if x["event"] == "done"]
    assert (done["progress"], done["status"]) == (80, "nearly")


def test_a_renewal_after_the_lease_was_lost_changes_nothing_of_the_new_owners_record(
    r: redis.Redis, write_config
) -> None:
    """Daemon A read the entry; B took it over. Until B's own active record is written, the
    record of the entry is A's: B's renewal writes nothing into it (it did: what B's handler
    told showed as A's, then start.lua replaced the record and it was never sent again). Once
    B's record is written, A's renewal, with what A's handler told, finds the lease lost and
    writes nothing into it; B's own does."""
    config = load(str(write_config(queue_config("[/bin/true]", lease=LEASE))))
    queue = config.queues["q"]
    r.xgroup_create("jobd:q", queue.group, id="0", mkstream=True)
    entry = r.xadd("jobd:q", {"payload": "", "job_id": "a"}).decode()
    r.xreadgroup(queue.group, "A", {"jobd:q": ">"})
    r.xclaim("jobd:q", queue.group, "B", 0, [entry])
    a_record = f"jobd:q|{entry}\n".encode() + b'{"since":1,"deadline":2,"consumer":"A"}'
    r.hset(queue.keys.active, "a", a_record)
    b_told = Shown(entry, "a", 5.0, b"B's")
    assert Store(r, "B").renew_telling(queue, [entry], [b_told]) == ([], [])
    assert r.hget(queue.keys.active, "a") == a_record
    b_record = f"jobd:q|{entry}\n".encode() + b'{"since":1,"deadline":2,"consumer":"B"}'
    r.hset(queue.keys.active, "a", b_record)
    told = Shown(entry, "a", 99.0, b"A's")
    lost, written = Store(r, "A").renew_telling(queue, [entry], [told])
    assert [x.owner for x in lost] == ["B"] and written == []
    assert r.hget(queue.keys.active, "a") == b_record
    # B's own renewal writes it, and again replaces what it wrote before.
    (_, written) = Store(r, "B").renew_telling(queue, [entry], [told])
    assert written == [entry]
    again = Shown(entry, "a", 100.0, b"caf\xe9")
    assert Store(r, "B").renew_telling(queue, [entry], [again]) == ([], [entry])
    assert r.hget(queue.keys.active, "a") == (
        f"jobd:q|{entry}\n".encode() + b'{"progress":100,"status":"caf\\\\xe9",'
        b'"since":1,"deadline":2,"consumer":"B"}'
    )


def test_a_deadline_told_replaces_the_records_as_since_plus_it(
    r: redis.Redis, write_config
) -> None:
    """A handler that extended its deadline (``Shown.deadline_ms``, ms after its start) has its
    record's deadline since plus it, the rest of the record as start.lua wrote it; told alone
    (no progress, no status) the record is still one JSON object; a renewal that tells no
    deadline leaves the one written."""
    config = load(str(write_config(queue_config("[/bin/true]", lease=LEASE))))
    queue = config.queues["q"]
    r.xgroup_create("jobd:q", queue.group, id="0", mkstream=True)
    entry = r.xadd("jobd:q", {"payload": "", "job_id": "a"}).decode()
    r.xreadgroup(queue.group, "A", {"jobd:q": ">"})
    head = f"jobd:q|{entry}\n".encode()
    r.hset(queue.keys.active, "a", head + b'{"since":1000,"deadline":2000,"consumer":"A"}')
    extended = Shown(entry, "a", None, None, 20_000)
    assert Store(r, "A").renew_telling(queue, [entry], [extended]) == ([], [entry])
    record = r.hget(queue.keys.active, "a")
    assert record == head + b'{"since":1000,"deadline":21000,"consumer":"A"}'
    assert json.loads(record.partition(b"\n")[2])["deadline"] == 21_000
    assert Store(r, "A").renew_telling(queue, [entry], [Shown(entry, "a", 7.0, None)])
    assert r.hget(queue.keys.active, "a") == (
        head + b'{"progress":7,"since":1000,"deadline":21000,"consumer":"A"}'
    )
    # What the daemon sends: what it enforces, never before its own (start + timeout).
    handler = SimpleNamespace(started=100.0, timeout=1.0)
    assert deadline_ms(handler, None) is None
    assert deadline_ms(handler, 100.5) == 1000 and deadline_ms(handler, 120.0) == 20_000


# 500 messages as fast as the channel takes them, each a new progress and status, then waits.
CHATTY = """\
#!{python}
import os, socket, sys, time
folder = sys.argv[1]
address = os.environ["NOTIFY_SOCKET"]
open(os.path.join(folder, "started"), "w").close()
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
    for i in range(500):
        s.sendto(b"X_JOBD_PROGRESS=%d\\nSTATUS=item %d" % (i // 5, i), "\\0" + address[1:])
open(os.path.join(folder, "sent"), "w").close()
while not os.path.exists(os.path.join(folder, "go")):
    time.sleep(0.05)
"""


def script_calls(r: redis.Redis) -> int:
    """Script calls Redis has served (every write of the daemon's is one; the commands a
    script calls are counted under their own names, HSET and the like: not these)."""
    stats = r.info("commandstats")
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0)
               for name in ("eval", "evalsha", "fcall"))  # fmt: skip


def test_five_hundred_messages_cost_no_round_trip_of_their_own(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """What a handler tells travels with its lease renewals: 500 messages in a burst reach its
    active record (the last of them) for a handful of script calls, not one a message."""
    script("chatty.py", CHATTY.format(python=sys.executable))
    config = write_config(queue_config(f"[./chatty.py, {tmp_path}]", lease=LEASE))
    d = daemon(config)
    r.xadd("jobd:q", {"payload": "", "job_id": "chatty"})
    wait_until(lambda: (tmp_path / "started").exists(), what="the handler started")
    before, began = script_calls(r), time.monotonic()
    wait_until(lambda: (tmp_path / "sent").exists(), what="500 messages sent")
    active = load(str(config)).queues["q"].keys.active
    wait_until(lambda: b'"status":"item 499"' in (r.hget(active, "chatty") or b""),
               what="the last message in its active record")  # fmt: skip
    calls = script_calls(r) - before  # the daemon's alone: HGET is not counted
    # Besides what was told: each renewal period's own calls (the renewal, the daemon's beat
    # in the registry), however long a loaded machine took for the burst.
    periods = (time.monotonic() - began) / 0.3
    shown = running_told(config, "chatty")
    assert shown and (shown["progress"], shown["status"]) == (99, "item 499")
    (tmp_path / "go").touch()
    assert told_count(d, "chatty") == 500
    assert calls < 20 + 4 * periods, (
        f"{calls} script calls for 500 messages in {periods:.0f} periods"
    )


def told_count(d: DaemonProcess, job: str) -> int:
    marker = f"job={job} attempt=1 told jobd: "
    d.wait_log(marker)
    return int(d.log().split(marker, 1)[1].split(" message(s)", 1)[0])


# Run first (by daemon A): says A's status, progress and result over and over on its own
# channel, and on B's too once it knows B's address; SIGTERM only counts what it sends after.
# Run second (by B, after the takeover): says B's status and progress, tells A where B's channel
# is, writes B's result once the test says "finish", and exits 0.
TWICE = """\
#!{python}
import os, signal, socket, sys, time
folder = sys.argv[1]
def path(name):
    return os.path.join(folder, name)
def abstract(address):
    return "\\0" + address[1:]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
try:
    os.mkdir(path("first"))
except FileExistsError:
    s.sendto(b"STATUS=B's status\\nX_JOBD_PROGRESS=50", abstract(os.environ["NOTIFY_SOCKET"]))
    with open(path("b.address.new"), "w") as f:
        f.write(os.environ["NOTIFY_SOCKET"])
    os.rename(path("b.address.new"), path("b.address"))
    while not os.path.exists(path("finish")):
        time.sleep(0.05)
    with open(os.environ["JOBD_RESULT"], "w") as f:
        f.write("B's result")
    sys.exit(0)
termed = []
signal.signal(signal.SIGTERM, lambda *_: termed.append(1))
mine = [abstract(os.environ["NOTIFY_SOCKET"])]
after = 0
message = b"STATUS=A's status\\nX_JOBD_PROGRESS=99\\nX_JOBD_RESULT=A's result"
while True:
    if len(mine) == 1 and os.path.exists(path("b.address")):
        mine.append(abstract(open(path("b.address")).read()))
    for address in mine:
        try:
            s.sendto(message, socket.MSG_DONTWAIT, address)
        except OSError:  # its daemon stopped: the socket's queue is full
            continue
        after += bool(termed)
    with open(path("after.new"), "w") as f:
        f.write(str(after))
    os.rename(path("after.new"), path("after"))
    time.sleep(0.05)
"""


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as page:
        return page.read().decode()


def test_a_handler_talking_after_its_lease_was_lost_changes_nothing_of_the_new_owners_job(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Daemon A runs the job; A is stopped past reclaim_after and B takes the job over and runs
    it. A's handler goes on saying its status, progress and result — on A's channel, before and
    after A, back, found its lease lost and stopped it, and on B's channel too. B's job shows
    B's handler's words only, while it runs and in its history, and its result is B's: what
    ``enqueue --wait`` prints."""
    script("twice.py", TWICE.format(python=sys.executable))
    settings = dict(lease="{renew_every: 300ms, reclaim_after: 1s}", timeout="1m",
                    kill_grace="1s", retry="{max_attempts: 1}")  # fmt: skip
    a_port, b_port = free_port(), free_port()
    text = queue_config(f"[./twice.py, {tmp_path}]", **settings)
    a_config, b_config = (
        write_config(text + f"metrics: {{listen: '127.0.0.1:{port}'}}\n", name)
        for name, port in (("a.yaml", a_port), ("b.yaml", b_port))
    )
    a = daemon(a_config)
    waiter = subprocess.Popen(
        [sys.executable, "-m", "jobd", "enqueue", "-c", str(a_config), "q", "", "--job-id", "j",
         "--wait", "--wait-timeout", "60s"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        running = wait_until(lambda: running_told(a_config, "j"), what="A's handler told")
        assert (running["consumer"], running["status"]) == (a.consumer(), "A's status")
        a.signal(signal.SIGSTOP)
        process = psutil.Process(a.proc.pid)
        wait_until(lambda: process.status() == psutil.STATUS_STOPPED, what="A stopped")
        try:
            b = daemon(b_config)

            def b_told() -> dict[str, Any] | None:
                found = running_told(b_config, "j")
                return found if found and found["consumer"] == b.consumer() else None

            running = wait_until(b_told, what="B's handler running and told")
            assert (running["status"], running["progress"]) == ("B's status", 50)
            # A's handler speaks on B's channel: B drops it, whose job it is not.
            wait_until(lambda: 'reason="stranger"} ' in scrape(b_port), what="B drops A's")
        finally:
            a.signal(signal.SIGCONT)
        a.wait_log("lease lost: the entry now belongs to consumer")
        wait_until(lambda: int((tmp_path / "after").read_text() or 0) >= 3,
                   what="A's handler talking after its lease was lost")  # fmt: skip
        a.wait_log("job=j attempt=1 told jobd: ")  # A's handler ended, what it said heard
        assert 'status "A\'s status"' in a.log().split("job=j attempt=1 told jobd: ")[1]
        assert 'jobd_notify_messages_total{queue="q"}' in scrape(a_port)
        running = b_told()
        assert running and (running["status"], running["progress"]) == ("B's status", 50)
        (tmp_path / "finish").touch()
        out, err = waiter.communicate(timeout=30)
    finally:
        (tmp_path / "finish").touch()
        if waiter.poll() is None:
            waiter.kill()
    assert (waiter.returncode, out) == (0, b"B's result"), err
    view = job_json(b_config, "j")
    assert view["result"] == "B's result"
    (done,) = [x for x in view["records"] if x["event"] == "done"]
    assert (done["consumer"], done["status"], done["progress"]) == (b.consumer(), "B's status", 50)
    assert not any(x.get("result") == "A's result" for x in view["records"]), view["records"]
