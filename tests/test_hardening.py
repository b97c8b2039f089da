"""Hardening (issue 17): the embedded Redis's data is jobd's user's alone; a handler of the
daemon's user cannot read the daemon's environment or memory; the units run jobd unprivileged
and sandboxed. Real processes, real users (root and nobody), real systemd-analyze."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import redis
from support import DaemonProcess, RedisServer, acked_all, jobd_cli, wait_until

from jobd import hardening

Daemon = Callable[..., DaemonProcess]
ROOT = Path(__file__).resolve().parent.parent
SYSTEMD = ROOT / "systemd"
NOBODY = pwd.getpwnam("nobody")
SECRET = "hunter2-correct-horse-battery"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
needs_setpriv = pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv is missing")
needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is missing (.ci/run installs systemd)",
)

# A handler that tries what a security review did: read its parent's (the daemon's)
# environment, and its stack (where the initial environment block sits) through /proc.
SNOOP = """
import json, os, re, sys
sys.stdin.read()
ppid, secret = os.getppid(), {secret!r}.encode()
report = {{}}
try:
    with open(f"/proc/{{ppid}}/environ", "rb") as f:
        report["environ_has_secret"] = secret in f.read()
except OSError as exc:
    report["environ"] = exc.strerror
try:
    with open(f"/proc/{{ppid}}/mem", "rb") as mem:
        maps = open(f"/proc/{{ppid}}/maps").read()
        low, high = (int(x, 16) for x in re.search(r"^(\\w+)-(\\w+) .*\\[stack\\]$", maps, re.M).groups())
        mem.seek(low)
        report["mem_has_secret"] = secret in mem.read(high - low)
except OSError as exc:
    report["mem"] = exc.strerror
with open({report!r}, "w") as f:
    json.dump(report, f)
"""


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder other users may enter (pytest's temporary folders are root's alone): what
    keeps them out of what is inside must be the inside's own permissions."""
    path = Path(tempfile.mkdtemp(prefix="jobd-hardening-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_nobody(*argv: str, **kwargs: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        list(argv), user=NOBODY.pw_uid, group=NOBODY.pw_gid, extra_groups=[],
        capture_output=True, timeout=60, **kwargs,  # type: ignore[arg-type]
    )  # fmt: skip


def write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.write_text(textwrap.dedent(text).lstrip())
    path.chmod(mode)
    return path


@contextlib.contextmanager
def running(argv: list[str], log: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """A daemon started with ``argv``; killed, with everything it started, at the end."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until(lambda: proc.poll() is not None or "jobd running" in log.read_text(),
                   what="the daemon to start")  # fmt: skip
        assert proc.poll() is None, log.read_text()
        yield proc
    finally:
        children = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        proc.kill()
        proc.wait()
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        print(f"--- daemon log ---\n{log.read_text(errors='replace')}")


# -- (1) the embedded Redis's state directory ----------------------------------------------------


def embedded_config(folder: Path) -> Path:
    write(folder / "h.sh", "#!/bin/sh\ncat > /dev/null\n", 0o755)
    return write(
        folder / "jobd.yaml",
        "redis: {embedded: {dir: state}}\nqueues:\n  q: {command: [./h.sh]}\n",
    )


def enqueue_with_umask_022(config: Path, payload: str) -> subprocess.CompletedProcess[bytes]:
    """`jobd enqueue` as a shell with the usual umask 022 runs it (the embedded server is started
    for the length of the command, and writes the job to its AOF)."""
    return subprocess.run(
        [sys.executable, "-m", "jobd", "enqueue", "-c", str(config), "q", payload],
        capture_output=True, timeout=60, umask=0o022,
    )  # fmt: skip


def tree(folder: Path) -> list[Path]:
    return [folder, *sorted(folder.rglob("*"))]


@needs_root
def test_embedded_state_is_private_in_an_existing_open_directory(open_dir: Path) -> None:
    """The review's read: a state directory that already existed 0755 (systemd's default for
    StateDirectory=) kept it, and redis-server wrote the AOF 0644 under umask 022."""
    config = embedded_config(open_dir)
    state = open_dir / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    write(state / "redis.log", "an earlier run's log\n", 0o644)

    result = enqueue_with_umask_022(config, SECRET)
    assert result.returncode == 0, result.stderr
    said = f"state directory {state}: group or others had access to {state}, {state}/redis.log;"
    assert f"{said} made private (go-rwx)" in result.stderr.decode()
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    aof = sorted((state / "appendonlydir").iterdir())
    assert any(p.name.endswith(".aof") for p in aof) and any(p.name.endswith(".rdb") for p in aof)
    assert SECRET.encode() in b"".join(p.read_bytes() for p in aof), "the payload is in the AOF"
    loose = {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in tree(state)
             if p.stat().st_mode & 0o077}  # fmt: skip
    assert loose == {}, "nothing in the state directory is open to group or others"
    for path in tree(state):
        assert as_nobody("cat" if path.is_file() else "ls", str(path)).returncode != 0, path

    # State an earlier version left open (0755 folders, 0644 files) is closed on the next start.
    for path in tree(state):
        path.chmod(path.stat().st_mode | 0o055)
    assert enqueue_with_umask_022(config, "again").returncode == 0
    assert [p for p in tree(state) if p.stat().st_mode & 0o077] == []
    assert as_nobody("cat", str(aof[0])).returncode != 0


@needs_root
def test_a_state_directory_owned_by_another_user_is_refused(open_dir: Path) -> None:
    config = embedded_config(open_dir)
    state = open_dir / "state"
    state.mkdir(mode=0o700)
    os.chown(state, NOBODY.pw_uid, NOBODY.pw_gid)
    because = "is owned by nobody (uid 65534), not by root (uid 0) that jobd runs as"
    enqueue = enqueue_with_umask_022(config, "x")
    assert enqueue.returncode == 69, enqueue.stderr
    assert because in enqueue.stderr.decode() and b"Traceback" not in enqueue.stderr
    run = jobd_cli("run", str(config))
    assert run.returncode == 69, run.stderr
    assert because in run.stderr.decode()
    assert list(state.iterdir()) == [], "no server was started there"


def snapshot(folder: Path) -> dict[str, tuple[int, int, int]]:
    """Every path under ``folder``, symbolic links not followed: its mode, owner and size."""
    found = {}
    for top, dirs, files in os.walk(folder):
        for path in (Path(top), *(Path(top) / name for name in (*dirs, *files))):
            info = path.lstat()
            found[str(path)] = (info.st_mode, info.st_uid, info.st_size)
    return found


def files_holding(folder: Path, text: str) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def refused(result: subprocess.CompletedProcess[bytes], because: str) -> bool:
    """The command exited 69 (the embedded Redis is unavailable), saying ``because``."""
    error = result.stderr.decode()
    assert result.returncode == 69 and because in error and "Traceback" not in error, error
    return True


@needs_root
def test_a_state_directory_in_a_folder_others_may_write_is_refused(open_dir: Path) -> None:
    """The review's (1a): nobody, who may write the config's folder (0777), replaced `.jobd` with
    a link to a directory of root's; root's `jobd status` made that directory 0700 and its
    files 0600, and wrote the server's files into it."""
    app = open_dir / "app"
    app.mkdir()
    app.chmod(0o777)
    config = write(app / "jobd.yaml", "queues:\n  q: {command: [/bin/cat]}\n")
    victim = open_dir / "victim"
    victim.mkdir()
    victim.chmod(0o755)
    write(victim / "readme.txt", "public data\n", 0o644)
    before = snapshot(victim)
    assert as_nobody("ln", "-s", str(victim), str(app / ".jobd")).returncode == 0
    because = f"is reached through {app}, which any user may write (mode 0777, without the sticky"
    assert refused(jobd_cli("status", "-c", str(config)), because)
    assert snapshot(victim) == before, "nothing there was changed, nor written"

    # A real directory of root's there is refused as well: nobody could swap it at any time.
    (app / ".jobd").unlink()
    (app / ".jobd").mkdir(mode=0o700)
    assert refused(jobd_cli("status", "-c", str(config)), because)
    assert list((app / ".jobd").iterdir()) == []
    # So is a folder another user owns; not a shared folder with the sticky bit (like /tmp).
    app.chmod(0o755)
    os.chown(app, NOBODY.pw_uid, NOBODY.pw_gid)
    because = f"is reached through {app}, which is owned by nobody (uid 65534)"
    assert refused(jobd_cli("status", "-c", str(config)), because)
    os.chown(app, 0, 0)
    app.chmod(0o1777)
    result = jobd_cli("status", "-c", str(config))
    assert result.returncode == 0, result.stderr
    assert (app / ".jobd" / "appendonlydir").is_dir()


@needs_root
def test_a_state_directory_that_is_a_symbolic_link_is_refused(open_dir: Path) -> None:
    config = embedded_config(open_dir)
    real = open_dir / "real"
    real.mkdir()
    real.chmod(0o755)
    write(real / "readme.txt", "public data\n", 0o644)
    (open_dir / "state").symlink_to(real)
    before = snapshot(real)
    because = f"state directory {open_dir}/state is a symbolic link: jobd does not follow one"
    assert refused(enqueue_with_umask_022(config, SECRET), because)
    assert snapshot(real) == before


def link_to_a_folder_of_nobodys(state: Path, folder: Path) -> str:
    """The review's (1b): while the state directory was 0777, nobody made `appendonlydir` a
    link to a folder of theirs holding an AOF file anyone may append to. jobd had since made
    the directory 0700 but left the link (another user's), and the server appended every
    command to nobody's file."""
    drop = folder / "drop"
    drop.mkdir()
    drop.chmod(0o1777)
    loot = drop / "loot"
    state.chmod(0o777)
    for argv in (["mkdir", "-m", "0777", str(loot)],
                 ["sh", "-c", f"umask 0 && : > {loot}/appendonly.aof.1.incr.aof"],
                 ["ln", "-s", str(loot), str(state / "appendonlydir")]):  # fmt: skip
        assert as_nobody(*argv).returncode == 0, argv
    state.chmod(0o700)
    return f"{state}/appendonlydir is a symbolic link"


def open_to_others(state: Path, folder: Path) -> str:
    state.chmod(0o777)
    write(state / "redis.log", "an earlier run's log\n", 0o600)
    return f"{state} was writable by others (mode 0777)"


def a_file_of_nobodys(state: Path, folder: Path) -> str:
    write(state / "redis.log", "an earlier run's log\n", 0o600)
    os.chown(state / "redis.log", NOBODY.pw_uid, NOBODY.pw_gid)
    return f"{state}/redis.log is owned by nobody (uid 65534)"


def a_hard_link(state: Path, folder: Path) -> str:
    os.link(write(folder / "elsewhere", "not Redis's log\n", 0o600), state / "redis.log")
    return f"{state}/redis.log has 1 other hard link(s)"


def an_inner_folder_open_to_others(state: Path, folder: Path) -> str:
    (state / "appendonlydir").mkdir()
    (state / "appendonlydir").chmod(0o777)
    return f"{state}/appendonlydir was writable by others (mode 0777)"


@needs_root
@pytest.mark.parametrize(
    "plant",
    [link_to_a_folder_of_nobodys, open_to_others, a_file_of_nobodys, a_hard_link,
     an_inner_folder_open_to_others],
)  # fmt: skip
def test_a_state_directory_another_user_may_have_had_a_hand_in_is_left_alone(
    open_dir: Path, plant: Callable[[Path, Path], str]
) -> None:
    """jobd "fixed" such a directory (chmod 0700) and started the server there; now it refuses,
    says what it found and how to go on, and changes nothing."""
    config = embedded_config(open_dir)
    state = open_dir / "state"
    state.mkdir(mode=0o700)
    because = plant(state, open_dir)
    before = snapshot(open_dir)
    result = enqueue_with_umask_022(config, SECRET)
    assert refused(result, because)
    assert f"chmod -R go-rwx {state}" in result.stderr.decode()
    assert snapshot(open_dir) == before, "nothing was made private, nor written"
    assert files_holding(open_dir, SECRET) == []


def test_the_embedded_server_gets_no_secret_and_umask_077(tmp_path: Path, daemon: Daemon) -> None:
    """redis-server inherited the daemon's whole environment. It blanks /proc/PID/environ for
    its process title, but keeps a copy in its memory, and unlike jobd it stays dumpable: a
    handler of the same user could read a token or password there."""
    config = embedded_config(tmp_path)
    daemon(config, env={"DASHBOARD_TOKEN": SECRET, "JOBD_CONFIG": str(config)})
    pid = int(wait_until(lambda: _read(tmp_path / "state" / "redis.pid"), what="redis.pid"))
    memory = readable_memory(pid)
    assert b"PATH=" in memory, "its environment is in what was read"
    assert SECRET.encode() not in memory and b"JOBD_CONFIG=" not in memory
    umask = re.search(r"^Umask:\s+(\d+)$", Path(f"/proc/{pid}/status").read_text(), re.M)
    assert umask and umask.group(1) == "0077"


def readable_memory(pid: int) -> bytes:
    """Every readable mapping of process ``pid`` (as root)."""
    chunks = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb") as mem:
        for line in maps:
            span, perms = line.split()[:2]
            low, high = (int(x, 16) for x in span.split("-"))
            if perms.startswith("r"):
                with contextlib.suppress(OSError, ValueError):
                    mem.seek(low)
                    chunks.append(mem.read(high - low))
    return b"".join(chunks)


def _read(path: Path) -> str:
    with contextlib.suppress(FileNotFoundError):
        return path.read_text().strip()
    return ""


# -- (7) the daemon's environment and memory ------------------------------------------------------


def nobody_prefix(mount_point: Path) -> list[str]:
    """argv that runs the rest as nobody with this interpreter. Where the interpreter lives
    under a folder nobody may not enter (/root here), a private mount namespace puts an open
    tmpfs over that folder holding only the interpreter's tree; nothing else changes."""
    become = [
        "setpriv",
        f"--reuid={NOBODY.pw_uid}",
        f"--regid={NOBODY.pw_gid}",
        "--clear-groups",
        "--",
    ]
    with contextlib.suppress(OSError):  # PermissionError: nobody may not execute it
        if as_nobody(sys.executable, "-c", "import jobd.daemon.loop").returncode == 0:
            return become
    real = Path(os.path.realpath(sys.base_prefix))
    closed = next((p for p in reversed(real.parents) if not p.stat().st_mode & 0o001), None)
    if closed is None or shutil.which("unshare") is None:
        pytest.skip(f"nobody cannot run {sys.executable}, and no way around it here")
    inner = closed / real.relative_to(closed).parts[0]
    dance = (
        f"mount --bind {inner} {mount_point} && mount -t tmpfs -o mode=0755 jobd-test {closed} "
        f"&& mkdir {inner} && mount --bind {mount_point} {inner} && umount -l {mount_point} "
        '&& exec "$@"'
    )
    prefix = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        dance,
        "sh",
        *become,
    ]
    probe = subprocess.run(
        [*prefix, sys.executable, "-c", "import jobd.daemon.loop"], capture_output=True
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot run {sys.executable} as nobody here: {probe.stderr.decode()[-300:]}")
    return prefix


def snoop_report(folder: Path, name: str) -> dict[str, object]:
    path = folder / name
    return json.loads(path.read_text()) if path.exists() else {}


@needs_root
@needs_setpriv
def test_a_handler_of_the_daemons_user_cannot_read_its_environment_or_memory(
    tmp_path: Path, open_dir: Path
) -> None:
    """Daemon and handler both run as nobody; the daemon has REDIS_PASSWORD in its
    environment and Redis requires it."""
    server = RedisServer(tmp_path / "redis", ("--requirepass", SECRET))
    server.ping_options = {"password": SECRET}
    server.start()
    try:
        (open_dir / "mnt").mkdir()
        write(open_dir / "snoop.py", f"#!{sys.executable}\n" + SNOOP.format(
            secret=SECRET, report=str(open_dir / "report.json")), 0o755)  # fmt: skip
        config = write(open_dir / "jobd.yaml", f"""
            redis: {{url: 'redis://127.0.0.1:{server.port}/0', password: '${{REDIS_PASSWORD}}'}}
            queues:
              q: {{command: [./snoop.py]}}
            """)  # fmt: skip
        os.chown(open_dir, NOBODY.pw_uid, NOBODY.pw_gid)
        argv = [*nobody_prefix(open_dir / "mnt"), sys.executable, "-m", "jobd", "run", str(config)]
        env = {**os.environ, "REDIS_PASSWORD": SECRET}
        with running(argv, tmp_path / "daemon.log", env) as proc:
            assert psutil.Process(proc.pid).uids().real == NOBODY.pw_uid
            client = redis.Redis(port=server.port, password=SECRET)
            client.xadd("jobd:q", {"payload": "x"})
            wait_until(lambda: snoop_report(open_dir, "report.json"), what="the handler's report")
            assert snoop_report(open_dir, "report.json") == {
                "environ": "Permission denied", "mem": "Permission denied",
            }  # fmt: skip
            wait_until(lambda: acked_all(client, "jobd:q", 1), what="the job acknowledged")
            client.close()
            # Even root reading it (ps eww, a core dump) no longer finds the value.
            shown = Path(f"/proc/{proc.pid}/environ").read_bytes()
            assert b"REDIS_PASSWORD=" in shown and SECRET.encode() not in shown
        log = (tmp_path / "daemon.log").read_text()
        assert "removed from the environment once read (secrets): REDIS_PASSWORD" in log
    finally:
        server.stop()


CHILD = """
import os, sys
import jobd
from jobd import config, hardening
assert os.path.dirname(hardening.__file__) in jobd.__path__, "the checkout under test's"
path = sys.argv[1]
before = config.load(path)
protection = hardening.protect_process(path)
print(protection.non_dumpable, ",".join(protection.forgotten))
assert "REDIS_PASSWORD" not in os.environ and "DASHBOARD_TOKEN" not in os.environ
assert os.environ["REDIS_HOST"] == "127.0.0.1", "a host name is not a secret"
with open("/proc/self/environ", "rb") as f:
    shown = f.read()
assert b"REDIS_PASSWORD=" in shown and b"s3cret" not in shown and b"t0ken" not in shown
try:
    config.load(path)
except config.ConfigError:
    print("plain reload refused")
assert config.load(path, hardening.config_environ()) == before
print("reload ok")
"""


def test_protect_process_forgets_the_variables_the_config_read_secrets_from(
    tmp_path: Path,
) -> None:
    """In a process of its own: protect_process() changes the process it runs in."""
    config = write(tmp_path / "jobd.yaml", """
        redis: {url: 'redis://jobd:${REDIS_PASSWORD}@${REDIS_HOST}:6379/0'}
        dashboard: {actions: true, token: '${DASHBOARD_TOKEN}'}
        queues:
          q: {command: [/bin/true], env: {HOME_OF: '${HOME}'}}
        """)  # fmt: skip
    env = {**os.environ, "REDIS_PASSWORD": "s3cret", "REDIS_HOST": "127.0.0.1",
           "DASHBOARD_TOKEN": "t0ken-t0ken-t0ken"}  # fmt: skip
    result = subprocess.run([sys.executable, "-c", CHILD, str(config)], capture_output=True,
                            env=env, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().splitlines() == [
        "True DASHBOARD_TOKEN,REDIS_PASSWORD", "plain reload refused", "reload ok",
    ]  # fmt: skip


# The config in front of each subcommand's other arguments: positional for run and validate.
SUBCOMMANDS = {
    "run": ["run"], "validate": ["validate"], "status --watch": ["status", "--watch", "1", "-c"],
    "dashboard": ["dashboard", "--listen", "127.0.0.1:0", "-c"], "enqueue": ["enqueue", "-c"],
    "dlq": ["dlq", "-c"],
}  # fmt: skip
AFTER_CONFIG = {"enqueue": ["q", "x"], "dlq": ["q", "list"]}


def fifo_writer(fifo: Path) -> int | None:
    """The FIFO's write end once a process waits to read it (opening it then lets that
    process's open() return; its read() waits for what is written)."""
    try:
        return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: no reader yet
        return None


@needs_root
@needs_setpriv
@pytest.mark.parametrize("command", list(SUBCOMMANDS))
def test_every_subcommand_is_non_dumpable_before_it_reads_its_config(
    tmp_path: Path, open_dir: Path, command: str
) -> None:
    """The review's (5): only `jobd run`, once it had started, was non-dumpable; `dashboard`,
    `status --watch` and `validate` (the units' ExecStartPre) never were, and a process of the
    same user read REDIS_PASSWORD in /proc/PID/environ while `jobd run` imported and loaded its
    config. The config here is a FIFO: the command waits in the middle of reading it, and a
    process of its user (nobody) tries what race_environ.py did."""
    (open_dir / "mnt").mkdir()
    fifo = open_dir / "jobd.yaml"
    os.mkfifo(fifo, 0o600)
    for path in (open_dir, fifo):
        os.chown(path, NOBODY.pw_uid, NOBODY.pw_gid)
    argv = [*nobody_prefix(open_dir / "mnt"), sys.executable, "-m", "jobd",
            *SUBCOMMANDS[command], str(fifo), *AFTER_CONFIG.get(command, [])]  # fmt: skip
    env = {**os.environ, "REDIS_PASSWORD": SECRET}
    with open(tmp_path / "jobd.log", "wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        writer = wait_until(lambda: fifo_writer(fifo), what=f"jobd {command} to read its config")
        try:
            assert psutil.Process(proc.pid).uids().real == NOBODY.pw_uid
            snoop = as_nobody("cat", f"/proc/{proc.pid}/environ")
            assert SECRET.encode() not in snoop.stdout
            assert snoop.returncode == 1 and b"Permission denied" in snoop.stderr, snoop
        finally:
            os.close(writer)  # type: ignore[arg-type]
    finally:
        proc.kill()
        proc.wait()
        print(f"--- jobd {command} ---\n{(tmp_path / 'jobd.log').read_text(errors='replace')}")


WIPE_CHILD = """
import os, sys
from jobd import hardening
assert hardening.set_non_dumpable()
try:
    open("/proc/self/environ", "rb")
except PermissionError:
    pass
else:
    raise SystemExit("/proc/self/environ was still open to this process")
print(",".join(hardening.protect_process(sys.argv[1]).forgotten), flush=True)
sys.stdin.read()
"""


@needs_root
@needs_setpriv
def test_a_non_dumpable_process_that_is_not_root_wipes_its_secrets(open_dir: Path) -> None:
    """cli.main makes every command non-dumpable first; from then on a process that is not root
    can no longer open its own /proc/self/environ, where the wipe used to read the block."""
    (open_dir / "mnt").mkdir()
    config = write(open_dir / "jobd.yaml", """
        redis: {url: 'redis://127.0.0.1:6379/0', password: '${REDIS_PASSWORD}'}
        queues:
          q: {command: [/bin/true]}
        """)  # fmt: skip
    argv = [*nobody_prefix(open_dir / "mnt"), sys.executable, "-c", WIPE_CHILD, str(config)]
    env = {**os.environ, "REDIS_PASSWORD": SECRET}
    with subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            assert proc.stdout.readline() == b"REDIS_PASSWORD\n"
            assert psutil.Process(proc.pid).uids().real == NOBODY.pw_uid
            shown = Path(f"/proc/{proc.pid}/environ").read_bytes()  # as root
            assert b"REDIS_PASSWORD=" in shown and SECRET.encode() not in shown
            proc.stdin.close()
            assert proc.wait(30) == 0
        finally:
            proc.kill()


@pytest.mark.parametrize(
    ("url", "environ", "secret"),
    [
        ("${REDIS_URL}", {"REDIS_URL": "redis://:pw-pw-pw@127.0.0.1:6379/0"}, ["REDIS_URL"]),
        ("${REDIS_URL}", {"REDIS_URL": "redis://jobd:pw-pw-pw@127.0.0.1:6379/0"}, ["REDIS_URL"]),
        ("${REDIS_URL}", {"REDIS_URL": "redis://tok-tok-tok@127.0.0.1/0"}, ["REDIS_URL"]),
        ("${REDIS_URL}", {"REDIS_URL": "redis://127.0.0.1/0?password=pw-pw-pw"}, ["REDIS_URL"]),
        ("redis://${AUTHORITY}/0", {"AUTHORITY": "jobd:pw-pw-pw@127.0.0.1:6379"}, ["AUTHORITY"]),
        ("${REDIS_URL}", {"REDIS_URL": "redis://127.0.0.1:6379/0"}, []),
        ("redis://jobd:${PW}@${HOST}:6379/0", {"PW": "pw-pw-pw", "HOST": "127.0.0.1"}, ["PW"]),
        ("${SCHEME}://${HOST}:6379/0", {"SCHEME": "redis", "HOST": "127.0.0.1"}, []),
    ],
)
def test_a_variable_is_secret_when_redacting_the_url_it_is_in_hides_some_of_it(
    tmp_path: Path, url: str, environ: dict[str, str], secret: list[str]
) -> None:
    """The review's (7): `url: ${REDIS_URL}` was not forgotten. Which variables were secrets was
    decided by where their placeholder landed, and one standing for the whole URL holds no
    credentials; what matters is what redacting the URL hides of the variable's value. A URL
    without credentials is shown whole in every log line: nothing to forget."""
    config = write(tmp_path / "jobd.yaml", f"""
        redis: {{url: '{url}'}}
        queues:
          q: {{command: [/bin/true]}}
        """)  # fmt: skip
    assert hardening.secret_variables(str(config), {**environ, "HOME": "/root"}) == secret


@needs_root
def reload_and_check_no_secret(d: DaemonProcess, config: Path) -> None:
    """A reload reads the config again, its variables gone from the environment: it applies,
    and the secret shows nowhere in the log."""
    config.write_text(config.read_text().replace("[/bin/true]}", "[/bin/true], concurrency: 2}"))
    d.signal(signal.SIGHUP)
    d.wait_log("reload done")
    assert "reload refused" not in d.log() and SECRET not in d.log()


def test_a_whole_redis_url_from_a_variable_is_forgotten(tmp_path: Path, daemon: Daemon) -> None:
    """The review's e7: `url: ${REDIS_URL}`, the password in the URL; the daemon kept
    REDIS_URL, password and all, in its environment."""

    server = RedisServer(tmp_path / "redis")
    server.start()
    redis.Redis(port=server.port).config_set("requirepass", SECRET)
    try:
        config = write(tmp_path / "jobd.yaml", """
            redis: {url: '${REDIS_URL}'}
            queues:
              q: {command: [/bin/true]}
            """)  # fmt: skip
        d = daemon(config, env={"REDIS_URL": f"redis://:{SECRET}@127.0.0.1:{server.port}/0"})
        d.wait_log("removed from the environment once read (secrets): REDIS_URL")
        shown = Path(f"/proc/{d.proc.pid}/environ").read_bytes()  # as root: ps eww, a core
        assert b"REDIS_URL=" in shown and SECRET.encode() not in shown
        reload_and_check_no_secret(d, config)
    finally:
        server.stop()


# -- (13) the systemd units ----------------------------------------------------------------------


def unit_copy(folder: Path, unit: str, as_name: str, drop_in: bool = False) -> Path:
    """The unit in ``folder`` under ``as_name``, running this checkout's jobd; with
    ``drop_in``, systemd/jobd-run-as.conf in its drop-in folder, as the README installs it."""
    script = shutil.which("jobd", path=str(Path(sys.executable).parent))
    assert script
    path = folder / as_name
    path.write_text((SYSTEMD / unit).read_text().replace("/usr/local/bin/jobd", script))
    if drop_in:
        (folder / f"{unit}.d").mkdir()
        shutil.copy(SYSTEMD / "jobd-run-as.conf", folder / f"{unit}.d" / "run-as.conf")
    return path


def security(path: Path) -> tuple[float, str]:
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert found, result.stdout + result.stderr
    return float(found.group(1)), result.stdout


UNITS = [("jobd.service", "jobd.service"), ("jobd@.service", "jobd@media.service")]


@needs_analyze
@pytest.mark.parametrize(("unit", "as_name"), UNITS)
def test_the_units_run_jobd_unprivileged_with_exposure_at_most_5(
    tmp_path: Path, unit: str, as_name: str
) -> None:
    """Before: root, 7.4 MEDIUM."""
    exposure, report = security(unit_copy(tmp_path, unit, as_name))
    assert exposure <= 5.0, report
    assert re.search(r"✓ User=/DynamicUser=", report), report
    text = (SYSTEMD / unit).read_text()
    for line in ("StateDirectoryMode=0700", "UMask=0077", "CapabilityBoundingSet=\n", "Delegate=yes\n",
                 "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6", "SystemCallErrorNumber=EPERM"):  # fmt: skip
        assert line in text
    assert "\nMemoryDenyWriteExecute=" not in text, "it breaks JITs in handlers"


@needs_analyze
@pytest.mark.parametrize(("unit", "as_name"), UNITS)
def test_the_run_as_drop_in_verifies_and_bounds_root(
    tmp_path: Path, unit: str, as_name: str
) -> None:
    path = unit_copy(tmp_path, unit, as_name, drop_in=True)
    result = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0 and "jobd" not in result.stderr, result.stderr
    exposure, report = security(path)
    assert "Service runs as root user" in report, "the drop-in was read"
    assert exposure <= 5.0, report
    for allowed in ("CAP_SET(UID|GID|PCAP)", "CAP_KILL"):
        assert re.search(rf"✗ CapabilityBoundingSet=~{re.escape(allowed)}", report)
    assert "✓ CapabilityBoundingSet=~CAP_SYS_PTRACE" in report
    assert "✓ CapabilityBoundingSet=~CAP_(DAC_*|FOWNER|IPC_OWNER)" in report


@pytest.mark.skipif(shutil.which("systemd-sysusers") is None, reason="systemd-sysusers is missing")
def test_the_sysusers_file_creates_the_user_the_units_run_as(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    result = subprocess.run(
        ["systemd-sysusers", f"--root={tmp_path}", str(SYSTEMD / "jobd.sysusers.conf")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    [entry] = [line for line in (tmp_path / "etc/passwd").read_text().splitlines()
               if line.startswith("jobd:")]  # fmt: skip
    _, _, uid, _, _, home, shell = entry.split(":")
    assert 0 < int(uid) < 1000 and home == "/var/lib/jobd" and shell.endswith("nologin")
    for unit in ("jobd.service", "jobd@.service"):
        assert "\nUser=jobd\nGroup=jobd\n" in (SYSTEMD / unit).read_text()


def drop_in_capabilities() -> list[str]:
    text = (SYSTEMD / "jobd-run-as.conf").read_text()
    [line] = [x for x in text.splitlines() if x.startswith("CapabilityBoundingSet=")]
    return [c.removeprefix("CAP_").lower() for c in line.split("=", 1)[1].split()]


@needs_root
@needs_setpriv
def test_root_bounded_as_the_drop_in_says_runs_and_stops_handlers_of_another_user(
    r: redis.Redis, redis_server: RedisServer, tmp_path: Path, open_dir: Path
) -> None:
    """jobd as root with only the drop-in's capabilities (setpriv, as systemd would bound it):
    a run_as handler starts as nobody and is stopped at its timeout; a handler left root,
    without CAP_SYS_PTRACE, cannot read the non-dumpable daemon's environment or memory."""
    caps = ",".join(f"+{c}" for c in drop_in_capabilities())
    open_dir.chmod(0o1777)  # written by a handler of nobody and by one of root without CAP_DAC_*
    write(
        open_dir / "who.sh",
        f"#!/bin/sh\ncat >/dev/null\necho $(id -u) $$ > {open_dir}/who\nexec sleep 300\n",
        0o755,
    )
    write(open_dir / "snoop.py", f"#!{sys.executable}\n" + SNOOP.format(
        secret=SECRET, report=str(open_dir / "root-report.json")), 0o755)  # fmt: skip
    config = write(open_dir / "jobd.yaml", f"""
        redis: {{url: '{redis_server.url}'}}
        queues:
          users: {{command: [{open_dir}/who.sh], timeout: 500ms, kill_grace: 5s,
                   retry: {{max_attempts: 1}}, run_as: {{user: nobody}}}}
          rooted: {{command: [./snoop.py]}}
        """)  # fmt: skip
    argv = ["setpriv", f"--bounding-set=-all,{caps}", "--inh-caps=-all", "--no-new-privs", "--",
            sys.executable, "-m", "jobd", "run", str(config)]  # fmt: skip
    env = {**os.environ, "SOME_TOKEN": SECRET}
    with running(argv, tmp_path / "daemon.log", env) as proc:
        status = Path(f"/proc/{proc.pid}/status").read_text()
        # CAP_KILL, CAP_SETGID, CAP_SETUID: bits 5, 6 and 7
        assert re.search(r"^CapEff:\s+0+e0$", status, re.M), status
        r.xadd("jobd:users", {"payload": "x", "job_id": "sleeper"})
        who = wait_until(lambda: _read(open_dir / "who"), what="nobody's handler").split()  # type: ignore[union-attr]
        assert who[0] == str(NOBODY.pw_uid)
        wait_until(lambda: r.xlen("{jobd:users}:dead") == 1, what="the timed-out job dead-lettered")
        [(_, record)] = r.xrange("{jobd:users}:dead")
        assert record[b"jobd_error"] == b"timeout", record
        assert b"SIGKILL" not in (tmp_path / "daemon.log").read_bytes(), "SIGTERM was enough"
        assert not psutil.pid_exists(int(who[1])), "the daemon's signal reached nobody's handler"
        r.xadd("jobd:rooted", {"payload": "x"})
        wait_until(
            lambda: snoop_report(open_dir, "root-report.json"), what="the root handler's report"
        )
        assert snoop_report(open_dir, "root-report.json") == {
            "environ": "Permission denied", "mem": "Permission denied",
        }  # fmt: skip


def test_a_reload_still_expands_the_secrets_the_daemon_forgot(tmp_path: Path, daemon) -> None:
    """The daemon removes the variables it read secrets from; a reload (SIGHUP) must still
    expand them, or every reload of such a config would be refused."""

    from support import RedisServer

    server = RedisServer(tmp_path / "redis")
    server.start()
    redis.Redis(port=server.port).config_set("requirepass", SECRET)
    try:
        config = tmp_path / "jobd.yaml"
        config.write_text(
            f"redis: {{url: 'redis://127.0.0.1:{server.port}/0', password: '${{REDIS_PASSWORD}}'}}\n"
            "queues:\n  q: {command: [/bin/true]}\n"
        )
        d = daemon(config, env={"REDIS_PASSWORD": SECRET})
        d.wait_log("removed from the environment once read (secrets): REDIS_PASSWORD")
        reload_and_check_no_secret(d, config)
    finally:
        server.stop()
