"""One loop per core (issue 21): `processes: N` runs N daemons under one supervisor.

Real processes, real signals, a real Redis: the supervisor is `python -m jobd run`, its daemons
are the `jobd run … --process INDEX` it execs, and every check polls until a deadline."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import psutil
import pytest
import redis
from support import DEADLINE, DaemonProcess, acked_all, free_port, jobd_cli, wait_until

from jobd.cli.main import main
from jobd.config import digest, load
from jobd.daemon import handover, supervised
from jobd.daemon.supervisor import Supervisor
from jobd.daemon.zygote import Zygote

READY = "jobd.supervisor: ready: 2 daemon processes"
PR_SET_CHILD_SUBREAPER = 36


def processes_of(d: DaemonProcess) -> dict[int, int]:
    """The supervisor's daemons now: pid by process index."""
    found = {}
    for child in psutil.Process(d.proc.pid).children():
        try:
            name, zombie = child.name(), child.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            continue
        if name.startswith("jobd-p") and not zombie:  # /proc/PID/comm: jobd-pINDEX
            found[int(name.removeprefix("jobd-p"))] = child.pid
    return found


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def sample(text: str, series: str) -> float | None:
    """The value of one series (name and labels, as written) in Prometheus text."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return None


def supervisor(
    daemon: Callable[..., DaemonProcess], config: Path, env: dict[str, str] | None = None
) -> DaemonProcess:
    """`jobd run` of a config with `processes` over 1, once it said every daemon is ready."""
    d = daemon(config, env=env, ready=False)
    d.wait_log(READY)
    return d


def enqueue(config: Path, queue: str, n: int, prefix: str) -> list[str]:
    lines = "".join(f"{prefix}{i}\n" for i in range(n)).encode()
    out = jobd_cli("enqueue", "-c", str(config), queue, "--lines", "-", "--print-ids", stdin=lines)
    assert out.returncode == 0, out.stderr
    return out.stdout.decode().split()


def ran(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


@pytest.fixture
def host(
    write_config: Callable[..., Path], script: Callable[[str, str], Path], tmp_path: Path
) -> tuple[Path, Path, int]:
    """A config of two processes, its metrics port, and the file its handlers write to: each
    job appends its id (queue q at once, queue slow after two seconds)."""
    out = tmp_path / "ran.txt"
    script("record.sh", f'#!/bin/sh\necho "$JOBD_JOB_ID" >> {out}\n')
    script("slow.sh", f'#!/bin/sh\nsleep 2\necho "$JOBD_JOB_ID" >> {out}\n')
    port = free_port()
    config = write_config(f"""\
        redis: {{url: '{{redis}}'}}
        processes: 2
        metrics: {{listen: 127.0.0.1:{port}}}
        defaults: {{lease: {{renew_every: 1s, reclaim_after: 3s}}}}
        queues:
          q: {{command: [./record.sh], concurrency: 4}}
          slow: {{command: [./slow.sh], concurrency: 1}}
        """)  # fmt: skip
    return config, out, port


def test_two_processes_share_the_queues_behind_one_endpoint_and_drain_on_sigterm(
    host: tuple[Path, Path, int], daemon: Callable[..., DaemonProcess], r: redis.Redis
) -> None:
    config, out, port = host
    d = supervisor(daemon, config)
    assert sorted(processes_of(d)) == [1, 2]
    ids = enqueue(config, "q", 200, "job")
    wait_until(lambda: acked_all(r, "jobd:q", 200), what="200 jobs acknowledged")
    assert sorted(ran(out)) == sorted(ids), "every job ran, and once"
    consumers = [c["name"].decode() for c in r.xinfo_consumers("jobd:q", "jobd")]
    assert sorted(name[-3:] for name in consumers) == ["-p1", "-p2"], consumers
    log = d.log()
    for p in ("p1", "p2"):
        assert f"jobd.handler[{p}]: queue=q" in log, f"{p} ran jobs too"
    # One endpoint for the host: the jobs of both daemons, summed.
    series = 'jobd_jobs_succeeded_total{queue="q"}'
    wait_until(lambda: sample(get(port, "/metrics")[1], series) == 200, what="200 in /metrics")
    assert get(port, "/healthz") == (200, "ok\n")
    slots = 'jobd_slots_free{queue="q"}'
    wait_until(lambda: sample(get(port, "/metrics")[1], slots) == 8, what="4 + 4 free slots")
    # SIGTERM while each daemon runs a slow job: both drain, the supervisor exits 0.
    slow = enqueue(config, "slow", 2, "slow")
    running = 'jobd_handlers_running{queue="slow"}'  # at most one per daemon
    wait_until(lambda: sample(get(port, "/metrics")[1], running) == 2, what="2 slow jobs running")
    d.signal(signal.SIGTERM)
    assert d.proc.wait(30) == 0, d.log()
    log = d.log()
    for p in ("p1", "p2"):
        assert f"jobd.daemon[{p}]: SIGTERM: stopping; 1 handler(s) running" in log
        assert f"jobd.daemon[{p}]: jobd stopped" in log
    assert acked_all(r, "jobd:slow", 2) and sorted(ran(out)) == sorted(ids + slow)


def test_a_killed_process_is_started_again_and_jobs_still_run_once(
    host: tuple[Path, Path, int],
    daemon: Callable[..., DaemonProcess],
    r: redis.Redis,
    tmp_path: Path,
) -> None:
    config, out, port = host
    d = daemon(config, env={"TMPDIR": str(tmp_path)}, ready=False)  # its metrics files, here
    d.wait_log(READY)
    first = enqueue(config, "q", 200, "a")
    wait_until(lambda: acked_all(r, "jobd:q", 200), what="the first 200 jobs")
    before = processes_of(d)
    os.kill(before[1], signal.SIGKILL)
    d.wait_log(f"process p1 (pid {before[1]}) exited unasked (killed by SIGKILL)")
    after = wait_until(lambda: (p := processes_of(d)).get(1) not in (None, before[1]) and p)
    assert after[2] == before[2], "the other daemon ran on"  # type: ignore[index]
    d.wait_log(f"process p1 (pid {after[1]}) ready")  # type: ignore[index]
    second = enqueue(config, "q", 200, "b")
    wait_until(lambda: acked_all(r, "jobd:q", 400), what="the next 200 jobs")
    done = ran(out)
    assert len(done) == len(set(done)) == 400 and set(done) == set(first + second)
    restarts = sample(get(port, "/metrics")[1], 'jobd_process_restarts_total{process="1"}')
    assert restarts == 1
    # The new p1 carried on the counts of the one killed, in the same files: one set of files
    # per daemon, however often restarted, and no count lost.
    series = 'jobd_jobs_succeeded_total{queue="q"}'
    wait_until(lambda: sample(get(port, "/metrics")[1], series) == 400, what="400 in /metrics")
    [folder] = tmp_path.glob("jobd-*/metrics")
    files = sorted(f.name for f in folder.iterdir())
    assert all(f.endswith(("_p1.db", "_p2.db")) for f in files), files
    wait_until(lambda: get(port, "/healthz")[0] == 200, what="/healthz ok again")
    assert d.stop() == 0


def test_daemons_stop_by_themselves_when_the_supervisor_is_killed(
    host: tuple[Path, Path, int], daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    config, _, _ = host
    d = daemon(config, env={"TMPDIR": str(tmp_path)}, ready=False)  # what it leaves, kept here
    d.wait_log(READY)
    daemons = [psutil.Process(pid) for pid in processes_of(d).values()]
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait()
    gone = lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in daemons)  # noqa: E731
    wait_until(gone, what="the daemons to stop")
    for p in ("p1", "p2"):
        assert f"jobd.daemon[{p}]: the supervisor is gone: stopping" in d.log()
        assert f"jobd.daemon[{p}]: jobd stopped" in d.log()


def test_sighup_reaches_every_process(
    host: tuple[Path, Path, int], daemon: Callable[..., DaemonProcess], r: redis.Redis
) -> None:
    config, out, _ = host
    d = supervisor(daemon, config)
    config.write_text(config.read_text() + "  extra: {command: [./record.sh]}\n")
    d.signal(signal.SIGHUP)
    for p in ("p1", "p2"):
        d.wait_log(f"jobd.daemon[{p}]: reload done: q, slow, extra")
    wait_until(lambda: d.log().count(READY) == 2, what="READY again after the reload")
    [job] = enqueue(config, "extra", 1, "x")
    wait_until(lambda: job in ran(out), what="a job of the queue the reload added")
    assert d.stop() == 0


class Systemd:
    """A notify socket as systemd's: what arrives, and from which pid (SO_PASSCRED)."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.address = str(path)
        self.messages: list[tuple[int, dict[str, str]]] = []
        threading.Thread(target=self._collect, daemon=True).start()

    def _collect(self) -> None:
        while self.sock.fileno() >= 0:
            try:
                data, ancillary, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(12))
            except (TimeoutError, OSError):
                continue
            pid = struct.unpack("3i", ancillary[0][2][:12])[0]
            self.messages.append((pid, dict(x.split("=", 1) for x in data.decode().splitlines())))

    def having(self, key: str) -> list[dict[str, str]]:
        return [m for _, m in list(self.messages) if key in m]


def test_systemd_hears_the_supervisor_alone(
    host: tuple[Path, Path, int], daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    config, _, _ = host
    systemd = Systemd(tmp_path / "notify.sock")
    env = {"NOTIFY_SOCKET": systemd.address, "WATCHDOG_USEC": "400000"}
    d = daemon(config, env=env, ready=False)
    wait_until(lambda: systemd.having("READY"), what="READY=1")
    pids = processes_of(d)
    for index, pid in pids.items():
        assert f"process p{index} (pid {pid}) ready" in d.log(), "READY after every daemon's"
    wait_until(lambda: len(systemd.having("WATCHDOG")) >= 5, what="the supervisor's watchdog")
    d.signal(signal.SIGHUP)
    wait_until(lambda: len(systemd.having("READY")) == 2, what="READY=1 after the reload")
    d.signal(signal.SIGTERM)
    assert d.proc.wait(30) == 0, d.log()
    order = [k for _, m in systemd.messages for k in m if k in ("READY", "RELOADING", "STOPPING")]
    assert order == ["READY", "RELOADING", "READY", "STOPPING"]
    assert {pid for pid, _ in systemd.messages} == {d.proc.pid}, "no daemon talks to systemd"
    systemd.sock.close()


def test_embedded_redis_is_started_once_by_the_supervisor(
    tmp_path: Path, script: Callable[[str, str], Path], daemon: Callable[..., DaemonProcess]
) -> None:
    out = tmp_path / "ran.txt"
    script("record.sh", f'#!/bin/sh\necho "$JOBD_JOB_ID" >> {out}\n')
    config = tmp_path / "embedded.yaml"
    config.write_text("processes: 2\nqueues:\n  q: {command: [./record.sh]}\n")
    d = supervisor(daemon, config)
    servers = [
        p for p in psutil.Process(d.proc.pid).children(recursive=True)
        if p.name() in ("redis-server", "valkey-server")
    ]  # fmt: skip
    assert len(servers) == 1 and servers[0].ppid() == d.proc.pid, servers
    [job] = enqueue(config, "q", 1, "e")
    wait_until(lambda: ran(out) == [job], what="the job run")
    assert d.stop() == 0
    assert not servers[0].is_running(), "stopped with the supervisor"


def test_validate_processes(write_config: Callable[..., Path]) -> None:
    auto = write_config("processes: auto\nqueues:\n  q: {command: [/bin/true]}\n")
    result = jobd_cli("validate", str(auto), "--format", "json")
    cpus = sorted(os.sched_getaffinity(0))
    assert result.returncode == 0 and json.loads(result.stdout)["processes"] == len(cpus)
    if len(cpus) > 1:  # auto counts the CPUs jobd may run on (taskset, a cpuset), not the host's
        pinned = subprocess.run(
            ["taskset", "-c", str(cpus[0]), sys.executable, "-m", "jobd", "validate", str(auto),
             "--format", "json"], capture_output=True, timeout=60,
        )  # fmt: skip
        assert json.loads(pinned.stdout)["processes"] == 1, pinned.stderr
    two = write_config("processes: 2\nqueues:\n  q: {command: [/bin/true]}\n", name="two.yaml")
    assert ", in 2 processes" in jobd_cli("validate", str(two)).stdout.decode()
    for value in ("0", "many", "1.5", "1025", "1000000000000"):  # a huge one: a MemoryError
        bad = write_config(f"queues:\n  q: {{command: [/bin/true]}}\nprocesses: {value}\n")
        result = jobd_cli("validate", str(bad))
        assert result.returncode == 78
        assert result.stdout.decode().splitlines() == [
            f"{bad}:3:12: error: processes: {value if value != 'many' else repr(value)} is not "
            "valid here; write a number of processes from 1 to 1024, or auto (one per CPU)"
        ]


def running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def lines_of(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def test_a_dead_daemons_handlers_end_with_it_and_its_job_runs_again_once(
    write_config: Callable[..., Path],
    script: Callable[[str, str], Path],
    daemon: Callable[..., DaemonProcess],
    r: redis.Redis,
    tmp_path: Path,
) -> None:
    """A SIGKILLed daemon's handler (and the handler's child) are killed and reaped by the
    supervisor before the job is taken over: the job runs again once, never beside itself."""
    out = tmp_path / "ran.txt"
    script("long.sh", f'#!/bin/sh\nsleep 60 &\necho "$$ $! $JOBD_JOB_ID" >> {out}\nwait\n')
    config = write_config("""\
        redis: {url: '{redis}'}
        processes: 2
        defaults: {lease: {renew_every: 1s, reclaim_after: 3s}}
        queues:
          long: {command: [./long.sh], concurrency: 1}
        """)  # fmt: skip
    d = supervisor(daemon, config)
    [job] = enqueue(config, "long", 1, "l")
    wait_until(lambda: len(lines_of(out)) == 1, what="the job started")
    [[handler, child, ran_job]] = lines_of(out)
    assert ran_job == job
    first = [psutil.Process(int(handler)), psutil.Process(int(child))]
    daemons = processes_of(d)
    owner = first[0].ppid()
    [sibling] = [pid for pid in daemons.values() if pid != owner]
    os.kill(owner, signal.SIGKILL)
    killed = time.monotonic()
    # Gone, reaped (a zombie would still be a pid), within about a second.
    wait_until(lambda: not any(psutil.pid_exists(p.pid) for p in first), 1.5, "handler gone")
    assert time.monotonic() - killed < 1.5
    d.wait_log(f"process p{next(i for i, p in daemons.items() if p == owner)} left 2 process(es)")
    # After reclaim_after the job runs again, once, and the old run is long gone.
    wait_until(lambda: len(lines_of(out)) == 2, what="the job taken over")
    [[second, _, again]] = lines_of(out)[1:]
    assert again == job and int(second) not in (p.pid for p in first)
    assert not any(psutil.pid_exists(p.pid) for p in first), "never two runs at once"
    [entry] = r.xpending_range("jobd:long", "jobd", "-", "+", 10)
    assert entry["times_delivered"] == 2, entry
    assert psutil.pid_exists(sibling) and sibling in processes_of(d).values(), "sibling untouched"


@pytest.fixture
def acl_secret(r: redis.Redis) -> Iterator[tuple[str, str]]:
    """An ACL user whose password only the environment of `jobd run` holds."""
    password = f"s3cret-{os.getpid()}-{time.monotonic_ns()}"
    r.execute_command("ACL", "SETUSER", "jobd-secret", "on", f">{password}", "~*", "&*", "+@all")
    yield "jobd-secret", password
    r.acl_deluser("jobd-secret")


def environ_of(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone
        return []


def test_no_daemon_has_the_secrets_in_its_environment_even_once_restarted(
    write_config: Callable[..., Path],
    daemon: Callable[..., DaemonProcess],
    acl_secret: tuple[str, str],
) -> None:
    """The secrets a config expands reach each daemon on a socket: not one daemon, the first
    ones nor one started again, ever has them in its environment (/proc/PID/environ), which a
    handler of the same user reads while a new daemon is still dumpable."""
    user, password = acl_secret
    config = write_config(f"""\
        redis: {{url: '{{redis}}', username: {user}, password: '${{JOBD_TEST_PW}}'}}
        processes: 2
        queues:
          q: {{command: [/bin/true]}}
        """)  # fmt: skip
    seen: dict[int, list[bytes]] = {}
    watching = threading.Event()

    def watch() -> None:  # what a handler of the same user sees (as the repro did)
        while not watching.is_set():
            for entry in os.listdir("/proc"):
                if entry.isdigit() and int(entry) not in seen:
                    with contextlib.suppress(OSError):
                        if Path(f"/proc/{entry}/comm").read_bytes().startswith(b"jobd-p"):
                            seen[int(entry)] = environ_of(int(entry))
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    d = daemon(config, env={"JOBD_TEST_PW": password}, ready=False)
    d.wait_log(READY)  # both authenticated: Redis answered them
    before = processes_of(d)
    os.kill(before[1], signal.SIGKILL)
    new = wait_until(lambda: processes_of(d).get(1) not in (None, before[1]) and processes_of(d))
    d.wait_log(f"process p1 (pid {new[1]}) ready")  # type: ignore[index]
    watching.set()
    watcher.join()
    daemons = list(processes_of(d).values())
    assert before[1] not in daemons and set(daemons) <= set(seen), (daemons, seen)
    for pid in daemons:
        seen[pid] = environ_of(pid)  # and now, once started
    for pid, environ in seen.items():
        assert not [v for v in environ if v.startswith(b"JOBD_TEST_PW=") and v[13:]], pid  # wiped
        assert not [v for v in environ if password.encode() in v], pid
    assert password.encode() not in b"\0".join(environ_of(d.proc.pid)), "wiped in the supervisor"
    assert "JOBD_TEST_PW" in d.log(), "the supervisor says it forgot the variable"
    d.signal(signal.SIGHUP)  # a reload still expands it, from what the supervisor handed over
    for p in ("p1", "p2"):
        d.wait_log(f"jobd.daemon[{p}]: reload done: q")
    assert d.stop() == 0


def test_embedded_redis_stays_up_while_daemons_drain_after_the_supervisor_is_killed(
    tmp_path: Path, script: Callable[[str, str], Path], daemon: Callable[..., DaemonProcess]
) -> None:
    """The daemons hold the server's lock too: SIGKILL the supervisor, and a `jobd status`
    meanwhile uses the server instead of stopping it; the running jobs' outcomes are recorded."""
    out = tmp_path / "ran.txt"
    script("slow.sh", f'#!/bin/sh\necho "start $JOBD_JOB_ID" >> {out}\nsleep 3\n')
    config = tmp_path / "emb.yaml"
    config.write_text("processes: 2\nqueues:\n  q: {command: [./slow.sh], concurrency: 1}\n")
    d = supervisor(daemon, config)
    enqueue(config, "q", 2, "e")
    wait_until(lambda: len(lines_of(out)) == 2, what="both jobs running, one per daemon")
    [server] = [p for p in psutil.Process(d.proc.pid).children()
                if p.name() in ("redis-server", "valkey-server")]  # fmt: skip
    daemons = [psutil.Process(pid) for pid in processes_of(d).values()]
    client = redis.Redis(unix_socket_path=str(tmp_path / ".jobd" / "redis.sock"))
    try:
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        status = jobd_cli("status", "-c", str(config))
        assert status.returncode == 0, status.stderr
        assert server.is_running() and client.ping(), "the server was left to the daemons"
        wait_until(lambda: acked_all(client, "jobd:q", 2), what="both outcomes recorded")
        wait_until(lambda: not any(running(p) for p in daemons), what="the daemons to stop")
        assert "outcome(s) not recorded" not in d.log(), d.log()
    finally:
        for p in daemons:
            with contextlib.suppress(psutil.Error):
                p.kill()
        with contextlib.suppress(redis.RedisError):
            client.shutdown(nosave=True)
        client.close()


def started_again(d: DaemonProcess, index: int, killed: int) -> int:
    """The pid of daemon ``index`` once started again after pid ``killed``."""
    found = wait_until(lambda: processes_of(d).get(index) not in (None, killed) and processes_of(d))
    return found[index]  # type: ignore[index]


ATTACKER = """
import os, signal, subprocess, sys, time
supervisor, out = int(sys.argv[1]), sys.argv[2]
control = subprocess.Popen(["sleep", "60"])  # dumpable, this user's: its mem opens
time.sleep(0.1)
opened = []
try:
    open(f"/proc/{control.pid}/mem", "rb").close()
    opened.append("control")
finally:
    control.kill()
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
comm = lambda pid: open(f"/proc/{pid}/comm").read().strip()
image = comm(supervisor)  # a process not exec'd since its fork shows this, or jobd-NAME
ours = lambda pid: comm(pid) in (image,) or comm(pid).startswith("jobd-")
own_exe = os.readlink("/proc/self/exe")  # the supervisor's interpreter too (it cannot read its)
def still_jobd(pid):
    # After an open: exec sets the new program's exe before making it dumpable, and its comm
    # after that; so a child that exec'd another program (croniter runs file) in the instant
    # between the two checks above shows it here, where comm may not yet.
    try:
        return os.readlink(f"/proc/{pid}/exe") == own_exe and ours(pid)
    except OSError:
        return ours(pid)
family, tried = {supervisor}, set()  # the supervisor, and what it forked that is jobd still
while not stop:
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or entry in tried:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                ppid = int(stat.read().rsplit(b")", 1)[1].split()[1])
            if ppid not in family or not ours(entry):  # another program (croniter runs file)
                continue
            tried.add(entry)
            family.add(int(entry))
            open(f"/proc/{entry}/mem", "rb").close()  # the kernel checks here, and only here
            if still_jobd(entry):  # and it did not exec another program meanwhile
                opened.append(entry)
        except (OSError, ValueError, IndexError):
            pass
open(out, "w").write(" ".join(opened) + "\\n" + " ".join(sorted(tried)))
"""


def test_the_command_line_starts_no_process_before_it_is_non_dumpable() -> None:
    """Seen in CI through the test below: croniter, imported with jobd.config, runs `file` at
    import, so `jobd` forked a child before `main` made it non-dumpable: a copy of the process,
    its environment's secrets included, that a process of the same user could read until it
    exec'd. Nothing imported before `main` starts a process now."""
    probe = (
        "import subprocess, sys\n"
        "started = []\n"
        "real = subprocess.Popen.__init__\n"
        "def spy(self, *a, **k):\n"
        "    started.append(a[0] if a else k.get('args'))\n"
        "    real(self, *a, **k)\n"
        "subprocess.Popen.__init__ = spy\n"
        "import jobd.cli.main\n"
        "print(started, 'croniter' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] False", out.stdout


def test_no_daemon_is_ever_dumpable_so_a_handler_of_its_user_cannot_reach_its_memory(
    write_config: Callable[..., Path],
    daemon: Callable[..., DaemonProcess],
    acl_secret: tuple[str, str],
    tmp_path: Path,
) -> None:
    """The attack a review confirmed: where processes of one user may ptrace each other (no
    Yama here), a handler of jobd's user opens each new daemon's /proc/PID/mem in the instant
    it is dumpable (an exec'd interpreter, before jobd runs) and keeps reading it once the
    daemon has fetched the secrets. Here the supervisor and the attacker are root without
    CAP_SYS_PTRACE (as two processes of one user: dumpable decides) and the attacker tries
    every process forked from the supervisor that still runs jobd (the fork server, its middle
    processes, the daemons; not a program one of them exec'd), from its first instant, while
    daemons are killed and started again: it opens none (the daemons are forked from the
    never-dumpable fork server), though it opens a dumpable process of its own. The secrets' socket answers the daemons
    alone: the test's own connection gets nothing."""
    user, password = acl_secret
    config = write_config(f"""\
        redis: {{url: '{{redis}}', username: {user}, password: '${{JOBD_TEST_PW}}'}}
        processes: 2
        queues:
          q: {{command: [/bin/true]}}
        """)  # fmt: skip
    unprivileged = ["setpriv", "--bounding-set=-sys_ptrace", "--inh-caps=-sys_ptrace"]
    d = daemon(config, env={"JOBD_TEST_PW": password}, ready=False, prefix=unprivileged)
    out = tmp_path / "attacker.txt"
    attacker = subprocess.Popen([*unprivileged, sys.executable, "-c", ATTACKER,
                                 str(d.proc.pid), str(out)])  # fmt: skip
    try:
        d.wait_log(READY)  # both fetched the password: Redis let them in
        for _ in range(3):
            killed = processes_of(d)[1]
            os.kill(killed, signal.SIGKILL)
            again = started_again(d, 1, killed)
            d.wait_log(f"process p1 (pid {again}) ready")
        attacker.send_signal(signal.SIGTERM)
        assert attacker.wait(DEADLINE) == 0
    finally:
        attacker.kill()  # it polls /proc without end otherwise
        attacker.wait()
    opened, tried = (line.split() for line in out.read_text().splitlines())
    assert opened[:1] == ["control"], "the attacker opens a dumpable process of its user"
    assert {str(pid) for pid in processes_of(d).values()} <= set(tried), (tried, processes_of(d))
    assert opened == ["control"], f"a daemon's memory opened: {opened}"
    desk = next(c.laddr for c in psutil.Process(d.proc.pid).net_connections("unix")
                if c.laddr.endswith("secrets.sock"))  # fmt: skip
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(DEADLINE)
        sock.connect(desk)
        assert sock.recv(1 << 20) == b"", "the supervisor answers the daemons it started alone"
    d.wait_log("connection(s) asking for the secrets refused")
    assert d.stop() == 0


def test_a_daemon_that_cannot_run_here_stops_the_supervisor(
    write_config: Callable[..., Path], daemon: Callable[..., DaemonProcess]
) -> None:
    """`resources.pids` where no cgroup has the pids controller: each daemon refuses to start
    (exit 69), and so does the supervisor, at once, rather than restart them forever."""
    config = write_config("""\
        redis: {url: '{redis}'}
        processes: 2
        queues:
          q: {command: [/bin/true], resources: {pids: 10}}
        """)  # fmt: skip
    said = jobd_cli("validate", str(config)).stdout.decode()
    if "warning: " not in said or "pids" not in said:
        pytest.skip(f"this host can enforce resources.pids: {said}")
    d = daemon(config, ready=False)
    assert d.proc.wait(DEADLINE) == 69, d.log()
    log = d.log()
    assert "resources.pids needs a cgroup v2 with the pids controller" in log
    assert "cannot run here (exit 69): stopping every process, exiting 69" in log
    assert log.count("started: pid") <= 2, "no daemon was started again"


def last_start(log: str, index: int) -> str:
    """What daemon ``index`` said it runs, the last time it started."""
    return [line for line in log.splitlines()
            if f"jobd.daemon[p{index}]: jobd running as consumer" in line][-1]  # fmt: skip


def test_a_daemon_started_again_runs_the_config_in_force_and_a_bad_file_stops_nothing(
    host: tuple[Path, Path, int], daemon: Callable[..., DaemonProcess]
) -> None:
    """Found in review: a daemon started again read the file as it was then. An edit not yet
    reloaded reached that one daemon alone (one host, two configs), and a file that did not load
    (its reload refused, "the running config stays") made it exit 78, on which the supervisor
    stopped every daemon and exited 78, which systemd does not restart. Now it is handed the
    config in force: the file's text as the supervisor last found it valid."""
    config, out, _ = host
    d = supervisor(daemon, config)
    text = config.read_text()
    assert "x4" in last_start(d.log(), 1)
    config.write_text(text.replace("concurrency: 4", "concurrency: 7"))  # valid, not reloaded
    first = processes_of(d)
    os.kill(first[1], signal.SIGKILL)
    again = wait_until(lambda: processes_of(d).get(1) not in (None, first[1]) and processes_of(d))
    d.wait_log(f"process p1 (pid {again[1]}) ready")  # type: ignore[index]
    assert "x4" in last_start(d.log(), 1), "the config its sibling runs, not the edit"
    config.write_text("queues: [this does not load\n")
    d.signal(signal.SIGHUP)
    d.wait_log("jobd.daemon[p1]: reload refused")
    d.wait_log("jobd.daemon[p2]: reload refused")
    os.kill(again[2], signal.SIGKILL)  # type: ignore[index]
    latest = wait_until(lambda: processes_of(d).get(2) not in (None, again[2]) and processes_of(d))  # type: ignore[index]
    d.wait_log(f"process p2 (pid {latest[2]}) ready")  # type: ignore[index]
    assert d.proc.poll() is None and "exiting 78" not in d.log(), d.log()
    assert "x4" in last_start(d.log(), 2)
    config.write_text(text)
    ids = enqueue(config, "q", 4, "after")
    wait_until(lambda: sorted(ran(out)) == sorted(ids))
    assert d.stop() == 0, d.log()


def test_a_daemon_started_again_after_a_reload_they_refused_runs_what_its_siblings_run(
    host: tuple[Path, Path, int], daemon: Callable[..., DaemonProcess]
) -> None:
    """Found in review: the supervisor took the file it reread at a SIGHUP for the config in
    force though every daemon refused to reload it (a change only a restart applies), so a
    daemon started again ran it: here against another Redis, where nothing answers, beside a
    sibling on the first. Now a reloaded text is in force once a daemon says it runs it."""
    config, out, _ = host
    d = supervisor(daemon, config)
    text = config.read_text()
    url = text.split("url: '", 1)[1].split("'", 1)[0]
    elsewhere = f"redis://127.0.0.1:{free_port()}/0"
    config.write_text(text.replace(url, elsewhere).replace("concurrency: 4", "concurrency: 7"))
    d.signal(signal.SIGHUP)
    for p in (1, 2):
        d.wait_log(f"jobd.daemon[p{p}]: reload refused: changing redis needs a restart")
    first = processes_of(d)
    os.kill(first[1], signal.SIGKILL)
    again = wait_until(lambda: processes_of(d).get(1) not in (None, first[1]) and processes_of(d))
    d.wait_log(f"process p1 (pid {again[1]}) ready")  # type: ignore[index]
    assert "x4" in last_start(d.log(), 1), "the config its sibling runs"
    config.write_text(text.replace("concurrency: 4", "concurrency: 6"))  # a reload they apply
    d.signal(signal.SIGHUP)
    d.wait_log("runs the reloaded config: it is in force")
    for p in (1, 2):
        d.wait_log(f"jobd.daemon[p{p}]: reload done")
    refused = "jobd.daemon[p1]: reload refused: changing redis"
    assert d.log().count(refused) == 1, "the refused reload was answered: none owed p1 again"
    os.kill(again[2], signal.SIGKILL)  # type: ignore[index]
    latest = wait_until(lambda: processes_of(d).get(2) not in (None, again[2]) and processes_of(d))  # type: ignore[index]
    d.wait_log(f"process p2 (pid {latest[2]}) ready")  # type: ignore[index]
    assert "x6" in last_start(d.log(), 2), "the reloaded config"
    ids = enqueue(config, "q", 4, "after")
    wait_until(lambda: sorted(ran(out)) == sorted(ids))
    assert d.stop() == 0, d.log()


def test_the_config_in_force_is_the_text_a_daemon_says_it_runs(tmp_path: Path) -> None:
    path = tmp_path / "jobd.yaml"
    path.write_text("A")
    a, b, c, d = (digest(t) for t in "ABCD")
    in_force = handover.InForce(str(path), "A")
    in_force.offer("B")  # a reload
    assert in_force.pending(), "a daemon started now is owed it: its siblings may apply it"
    assert not in_force.heard(a) and in_force.pending(), "its start: no answer yet"
    assert not in_force.heard(a, read=b) and in_force.text == "A", "B read and refused"
    assert not in_force.pending(), "refused: owed to none"
    in_force.offer("B")
    in_force.offer("C")  # a second SIGHUP before the first was answered
    assert not in_force.heard(a, read=b) and in_force.pending(), "the answer to B, not to C"
    assert in_force.heard(c, read=c) and in_force.text == "C" and not in_force.pending()
    in_force.offer("B")
    in_force.offer("C")
    assert in_force.heard(b, read=b) and in_force.text == "B", "the first applied"
    assert in_force.pending(), "the second not answered yet"
    assert not in_force.heard(b, read=c) and not in_force.pending(), "C refused"
    in_force.offer("C")
    path.write_text("D")  # edited again before the daemons read it
    assert in_force.heard(d, read=d) and in_force.text == "D", "what the daemons read"
    assert not in_force.pending(), "D came after C: C is answered"
    assert not in_force.heard(digest("E")) and not in_force.heard(None) and in_force.text == "D"
    assert in_force.handed().config == "D"


def test_daemons_dead_at_a_sighup_run_the_reload_once_started_again(
    host: tuple[Path, Path, int], daemon: Callable[..., DaemonProcess]
) -> None:
    """Found in review of the fix above: a daemon dead at the SIGHUP (waiting out its backoff)
    was handed the text in force and never reloaded; with every daemon dead, no one ever
    applied the reload. Now a daemon started while a reload is unanswered is owed it."""
    config, out, _ = host
    d = supervisor(daemon, config)
    first = processes_of(d)
    for pid in first.values():
        os.kill(pid, signal.SIGKILL)
    config.write_text(config.read_text().replace("concurrency: 4", "concurrency: 6"))
    d.signal(signal.SIGHUP)  # within the backoff (0.5 s): no daemon is running
    for p in (1, 2):
        d.wait_log(f"jobd.daemon[p{p}]: reload done")
    d.wait_log("runs the reloaded config: it is in force")
    again = processes_of(d)
    os.kill(again[1], signal.SIGKILL)
    latest = wait_until(lambda: processes_of(d).get(1) not in (None, again[1]) and processes_of(d))
    d.wait_log(f"process p1 (pid {latest[1]}) ready")  # type: ignore[index]
    assert "x6" in last_start(d.log(), 1), "the reloaded config, in force"
    ids = enqueue(config, "q", 4, "after")
    wait_until(lambda: sorted(ran(out)) == sorted(ids))
    assert d.stop() == 0, d.log()


def test_sigterm_while_a_daemon_waits_to_be_started_again_exits_0(
    host: tuple[Path, Path, int], daemon: Callable[..., DaemonProcess]
) -> None:
    config, _, _ = host
    d = supervisor(daemon, config)
    pid = processes_of(d)[2]
    os.kill(pid, signal.SIGKILL)
    d.wait_log(f"process p2 (pid {pid}) exited unasked")
    d.signal(signal.SIGTERM)  # within its 0.5 s backoff: the crash was handled already
    assert d.proc.wait(DEADLINE) == 0, d.log()
    assert d.log().count("process p2 started") == 1, "stopped before p2 started again"


def test_a_daemon_that_cannot_be_started_is_tried_again_after_its_backoff(
    write_config: Callable[..., Path],
) -> None:
    """A start that fails (here the fork server is gone) is a start to try again later, not an
    error to spin on."""
    config = load(str(write_config("processes: 2\nqueues:\n  q: {command: [/bin/true]}\n")))
    supervisor = Supervisor(config, "INFO", "text", Zygote.fork(main))
    try:
        os.kill(supervisor.zygote.pid, signal.SIGKILL)
        child = supervisor.children[0]
        now = time.monotonic()
        supervisor.start(child)
        assert not child.alive() and child.restart_at >= now + supervised.BACKOFF_FIRST
        supervisor.start(child)
        assert child.restart_at >= now + 2 * supervised.BACKOFF_FIRST, "backing off"
    finally:
        supervisor.close()


def test_a_daemon_once_ready_is_started_again_whatever_its_exit() -> None:
    """Only a daemon never ready under this supervisor can stop the host by its exit (78: the
    config, 69: this host): once one was ready, a crash followed by either (a file edited
    since, a transient failure) must not take its siblings down."""
    child = supervised.Child(1)
    assert child.fatal(78) == 78 and child.fatal(69) == 69
    child.ready()
    assert [child.fatal(code) for code in (78, 69, 1, -signal.SIGKILL)] == [None] * 4


def test_a_daemon_whose_pidfd_cannot_be_opened_is_not_left_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Out of descriptors once it is started: the daemon is killed and reaped (the start is
    tried again after its backoff), never left running unwatched beside the next."""

    def no_pidfd(pid: int) -> int:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    proc = subprocess.Popen(["sleep", "60"])
    monkeypatch.setattr(supervised.os, "pidfd_open", no_pidfd)
    child = supervised.Child(1)
    with pytest.raises(OSError):
        child.start(proc.pid)
    assert not psutil.pid_exists(proc.pid) and not child.alive(), "killed and reaped"
    proc.wait()  # reaped already: Popen learns it (ECHILD)


def signalled_to_death(pid: int) -> bool:
    """Whether ``pid`` is dying: a SIGKILL pending (sent, not yet acted on) or exited."""
    try:
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        )
    except FileNotFoundError:
        return True
    pending = int(status["ShdPnd"], 16) | int(status["SigPnd"], 16)
    return bool(pending & (1 << (signal.SIGKILL - 1))) or status["State"].split()[0] in "ZX"


def test_a_process_not_this_ones_child_is_not_taken_for_a_daemon() -> None:
    """The fork server's daemon is re-parented to the supervisor (a child subreaper); a pid that
    is not its child could be neither reaped nor known to be a daemon: the start fails, and
    that process is left alone (found in review: a stale pid was SIGKILLed)."""
    out = subprocess.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True)
    other = psutil.Process(int(out.stdout))
    child = supervised.Child(1)
    try:
        with pytest.raises(OSError, match="not this process's child"):
            child.start(other.pid)
        assert not child.alive() and not signalled_to_death(other.pid)
    finally:
        other.kill()


def test_a_large_environment_still_starts_every_daemon(
    host: tuple[Path, Path, int], daemon: Callable[..., DaemonProcess]
) -> None:
    """Found in review: the fork server's request carried the whole environment in one message,
    which must fit the socket's buffer (about 200 KiB): with 300 KB of environment no daemon
    ever started. It carries what differs from the fork server's own now."""
    config, out, _ = host
    d = supervisor(daemon, config, env={f"JOBD_TEST_BIG{i}": "x" * 100_000 for i in range(3)})
    ids = enqueue(config, "q", 4, "big")
    wait_until(lambda: sorted(ran(out)) == sorted(ids), what="the jobs to run")
    assert d.stop() == 0


def test_sigterm_to_the_fork_server_is_not_taken_for_its_death(
    host: tuple[Path, Path, int], daemon: Callable[..., DaemonProcess]
) -> None:
    """Found in review: SIGTERM to every process of the service (`systemctl kill`, `pkill`)
    killed the fork server first, which the supervisor took for a failure: it stopped the
    daemons at once on the real SIGTERM and exited 1. The fork server ignores SIGTERM now."""
    config, _, _ = host
    d = supervisor(daemon, config)
    [zygote] = [p for p in psutil.Process(d.proc.pid).children() if p.name() == "jobd-forkserver"]
    zygote.terminate()
    for pid in processes_of(d).values():
        os.kill(pid, signal.SIGTERM)
    d.signal(signal.SIGTERM)
    assert d.proc.wait(DEADLINE) == 0
    assert "the fork server (pid" not in d.log(), d.log()
    assert "jobd.supervisor: SIGTERM again" not in d.log(), d.log()


def test_the_fork_servers_death_stops_every_daemon_and_the_supervisor_fails(
    host: tuple[Path, Path, int], daemon: Callable[..., DaemonProcess]
) -> None:
    """Without it no daemon can be started again (never by exec: a dumpable instant): the
    supervisor drains every daemon and exits 1, for systemd to start the service again."""
    config, _, _ = host
    d = supervisor(daemon, config)
    [zygote] = [p for p in psutil.Process(d.proc.pid).children() if p.name() == "jobd-forkserver"]
    daemons = list(processes_of(d).values())
    zygote.kill()
    d.wait_log("the fork server (pid")
    assert d.proc.wait(DEADLINE) == 1
    assert not [pid for pid in daemons if psutil.pid_exists(pid)], "every daemon stopped"
    assert "process p1 (pid" in d.log() and "stopped: exit 0" in d.log(), "drained"


HOLDER = """
import os, socket, sys
sock = socket.socket(socket.AF_UNIX)
sock.connect(sys.argv[1])
if os.fork() == 0:  # the holder: keeps the connection its parent made, reads the answer
    got = b""
    while chunk := sock.recv(65536):
        got += chunk
    open(sys.argv[2], "wb").write(got)
    os._exit(0)
os._exit(0)  # the connecting process exits: the connection bears a pid now free for reuse
"""


def test_a_connection_made_before_a_daemon_started_is_refused_though_it_bears_its_pid(
    tmp_path: Path,
) -> None:
    """Found in review: the pid the kernel gives for a connection (SO_PEERCRED) is the
    connecting process's at connect. A process connects, hands the connection to a child and
    exits; the kernel gives its pid to the next daemon the supervisor starts (32 000 forks, a
    few seconds), and the supervisor answered that connection with the daemon's secrets and
    config. Right after a start (``fresh``), connections bearing the new pid are refused:
    here the connecting process's pid stands for the new daemon's."""
    desk = handover.Desk(str(tmp_path / "secrets.sock"))
    try:
        got = tmp_path / "got"
        connector = subprocess.Popen([sys.executable, "-c", HOLDER, desk.path, str(got)])
        assert connector.wait(DEADLINE) == 0
        pid = connector.pid  # reaped: free for the kernel to give again
        handed = handover.Handed({"JOBD_TEST_PW": "s3cret"}, "queues: {}\n")
        desk.serve(lambda p: p == pid, lambda: handed, fresh=pid)
        wait_until(got.exists)
        assert got.read_bytes() == b"", "refused: made before the daemon of that pid started"
    finally:
        desk.close()


def test_a_variable_a_reload_makes_a_secret_is_not_in_the_next_daemons_environment(
    write_config: Callable[..., Path],
    daemon: Callable[..., DaemonProcess],
    acl_secret: tuple[str, str],
    tmp_path: Path,
) -> None:
    """Found in review: after a SIGHUP whose file names a new secret variable, the supervisor
    still had it in its environment and passed it to the next daemon it started, whose
    /proc/PID/environ showed (to root alone now: no daemon is ever dumpable). The reload
    forgets it now, as the start does, and the fork server wipes it from its own block."""
    user, password = acl_secret
    text = f"""\
        redis: {{url: '{{redis}}', username: {user}, password: '${{VAR}}'}}
        processes: 2
        queues:
          q: {{command: [/bin/true]}}
        """
    config = write_config(text.replace("VAR", "JOBD_TEST_PW"))
    env = {"JOBD_TEST_PW": password, "JOBD_TEST_ALT": password}
    d = supervisor(daemon, config, env)
    assert b"JOBD_TEST_ALT=" + password.encode() in b"\0".join(environ_of(processes_of(d)[1]))
    write_config(text.replace("VAR", "JOBD_TEST_ALT"))
    d.signal(signal.SIGHUP)
    for p in ("p1", "p2"):
        d.wait_log(f"jobd.daemon[{p}]: reload done: q")
    first = processes_of(d)
    os.kill(first[1], signal.SIGKILL)
    again = wait_until(lambda: processes_of(d).get(1) not in (None, first[1]) and processes_of(d))
    environ = environ_of(again[1])  # type: ignore[index]
    assert environ and not [v for v in environ if password.encode() in v], environ
    d.wait_log(f"process p1 (pid {again[1]}) ready")  # type: ignore[index]
    assert d.stop() == 0


def test_a_start_whose_drain_fails_leaves_no_daemon_owed_its_secrets(
    write_config: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    """Found in review: a failure between the daemon's start and the drain of connections
    bearing its pid (its pidfd's epoll registration: ENOSPC once a user's watches run out)
    left it running, owed its secrets and undrained: a waiting stale connection got them next.
    Now such a start is undone (the daemon killed and reaped) and tried again later."""
    config = load(str(write_config("processes: 2\nqueues:\n  q: {command: [/bin/true]}\n")))
    supervisor = Supervisor(config, "INFO", "text", Zygote.fork(main))

    class Full:
        def register(self, fd: int, events: int) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    libc = ctypes.CDLL(None, use_errno=True)
    try:
        supervisor.orphans.adopt()  # a subreaper, as once open: the daemon is its child
        supervisor.epoll = Full()  # type: ignore[assignment]
        child = supervisor.children[0]
        now = time.monotonic()
        supervisor.start(child)
        assert "process p1 started" not in caplog.text, caplog.text
        assert not child.alive() and child.pid and not psutil.pid_exists(child.pid), "reaped"
        assert child.restart_at >= now + supervised.BACKOFF_FIRST, "tried again later"
    finally:
        supervisor.close()
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)  # this test process's orphans: init's


def test_a_daemon_takes_its_secrets_only_from_its_supervisor(tmp_path: Path) -> None:
    """A process of the same user may put a socket of its own in the supervisor's place (the
    directory is that user's): a daemon checks the socket's owner is its parent, and takes
    nothing from another (here the test's own socket, the test not being its parent)."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "secrets.sock"))
    listener.listen(1)

    def answer() -> None:
        body = json.dumps({"secrets": {"JOBD_TEST_PW": "forged"}, "config": "queues: {}"})
        with contextlib.suppress(OSError):  # refused: the daemon, or the test, may close first
            conn, _ = listener.accept()
            with conn:
                conn.sendall(struct.pack(">I", len(body)) + body.encode())

    threading.Thread(target=answer, daemon=True).start()
    try:
        with pytest.raises(OSError, match="not the supervisor's"):
            handover.take({handover.VARIABLE: str(tmp_path / "secrets.sock")})
    finally:
        listener.close()


GONE_LISTENER = """
import os, socket, struct, sys
listener = socket.socket(socket.AF_UNIX)
listener.bind(sys.argv[1])
listener.listen(1)
if os.fork() == 0:  # keeps the socket its parent listened on, answers with forged secrets
    os.close(1), os.close(2)  # the pipes the test reads are the parent's alone
    conn, _ = listener.accept()
    body = b'{"secrets": {"JOBD_TEST_PW": "forged"}, "config": "queues: {}"}'
    try:
        conn.sendall(struct.pack(">I", len(body)) + body)
    except OSError:
        pass
    os._exit(0)
print(os.getpid(), flush=True)
os._exit(0)  # the listening process is gone: its pid is free for the next supervisor
"""


def test_a_daemon_takes_no_secrets_from_a_socket_whose_listener_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found in review: the listener's pid (SO_PEERCRED) is the listening process's at listen.
    A process listens, hands the socket to a child and exits; once the kernel gives its pid to
    a supervisor, the socket put in that supervisor's directory passed the daemon's parent
    check. Here the gone process's pid stands for the daemon's parent: refused, where the
    kernel gives a pidfd of the listener (Linux 6.5+)."""
    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.getsockopt(socket.SOL_SOCKET, handover.SO_PEERPIDFD)
    except OSError as exc:
        if exc.errno in (errno.ENOPROTOOPT, errno.EINVAL):
            pytest.skip("no SO_PEERPIDFD on this kernel: the pid check alone")
    finally:
        probe.close()
    path = str(tmp_path / "secrets.sock")
    gone = subprocess.run([sys.executable, "-c", GONE_LISTENER, path], capture_output=True,
                          timeout=DEADLINE)  # fmt: skip
    monkeypatch.setattr(handover.os, "getppid", lambda: int(gone.stdout))
    with pytest.raises(OSError, match="not the supervisor's"):
        handover.take({handover.VARIABLE: path})


def test_out_of_descriptors_the_secrets_socket_sheds_connections_without_spinning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Left from the review: out of descriptors, the supervisor's accept failed (EMFILE) on a
    connection that stayed waiting, so each turn of its loop logged an internal error. Now the
    connection is taken with a descriptor kept in reserve and closed (that daemon is started
    again), said once, and the next turn finds nothing waiting and says nothing (a second
    review: accept fails out of descriptors whether or not a connection waits, and each failure
    was said to be one refused, 64 times a turn, 128 after a start)."""
    desk = handover.Desk(str(tmp_path / "secrets.sock"))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    filler: list[int] = []
    with socket.socket(socket.AF_UNIX) as asking:
        asking.connect(desk.path)
        try:
            top = max(int(fd) for fd in os.listdir("/proc/self/fd"))
            resource.setrlimit(resource.RLIMIT_NOFILE, (top + 16, hard))
            with contextlib.suppress(OSError):
                while True:
                    filler.append(os.open(os.devnull, os.O_RDONLY))
            desk.serve(lambda pid: True, lambda: handover.Handed({"PW": "x"}))  # raised EMFILE
            assert caplog.text.count("a connection for the secrets refused") == 1, caplog.text
            desk.serve(lambda pid: True, lambda: handover.Handed({"PW": "x"}), fresh=1)
            assert caplog.text.count("a connection for the secrets refused") == 1, "none waits"
        finally:
            for fd in filler:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        asking.settimeout(DEADLINE)
        assert asking.recv(1 << 20) == b"", "closed unanswered"
    desk.close()


def dump_environment(args: Sequence[str]) -> int:
    """A daemon's entry for the fork server test: its environment, as JSON, to ``args[0]``."""
    Path(args[0]).write_text(json.dumps(dict(os.environ)))
    return 0


def test_a_variable_given_again_after_a_start_without_it_reaches_the_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found in review: a start without a variable took it out of the fork server's environment
    for good, while the supervisor's copy still held it, so a later start asking for it with its
    old value sent nothing (not changed, not unset) and that daemon went without. Each start's
    daemon runs in exactly the environment asked for."""
    monkeypatch.setenv("JOBD_TEST_X", "orig")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # the daemons come back to this process
    zygote = Zygote.fork(dump_environment)
    try:
        asked = [{k: v for k, v in os.environ.items() if k != "JOBD_TEST_X"}, dict(os.environ)]
        for n, env in enumerate(asked):
            pid, gate = zygote.spawn([str(tmp_path / f"env{n}")], env, {})
            os.close(gate)
            assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
            got = json.loads((tmp_path / f"env{n}").read_text())
            assert got == env, set(got.items()) ^ set(env.items())
    finally:
        zygote.close()
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def test_sigint_to_a_daemon_before_it_handles_signals_ends_it_by_sigint(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C reaches the daemons through the supervisor, maybe before a daemon has its own
    handlers: it ended with a KeyboardInterrupt traceback and exit 70, "a bug in jobd", and the
    supervisor exited 1. Now it ends by SIGINT, as an interpreter does, which is a clean stop."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    zygote = Zygote.fork(dump_environment)
    try:
        pid, gate = zygote.spawn([str(tmp_path / "env")], dict(os.environ), {})
        wait_until(lambda: Path(f"/proc/{pid}/wchan").read_text().endswith("pipe_read"),
                   what="the daemon to wait at its gate")  # fmt: skip
        os.kill(pid, signal.SIGINT)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == -signal.SIGINT
        os.close(gate)
        assert -signal.SIGINT in supervised.CLEAN
        assert "Traceback" not in capfd.readouterr().err
    finally:
        zygote.close()
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def test_a_daemon_waits_at_its_gate_until_the_supervisor_has_drained_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen in CI under load: a daemon forked ready to run asked for its secrets within
    milliseconds, before the supervisor had turned away the connections already waiting with
    its pid, and was turned away as one of them (exit 75, started again, again). It waits at
    its gate now, until the supervisor closes it: nothing of it runs before."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    zygote = Zygote.fork(dump_environment)
    out = tmp_path / "env"
    try:
        pid, gate = zygote.spawn([str(out)], dict(os.environ), {})
        wait_until(lambda: Path(f"/proc/{pid}/wchan").read_text().endswith("pipe_read"),
                   what="the daemon to wait at its gate")  # fmt: skip
        assert not out.exists(), "it ran before its gate opened"
        os.close(gate)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0 and out.exists()
    finally:
        zygote.close()
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
