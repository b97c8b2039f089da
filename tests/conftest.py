"""Test fixtures: a private redis-server per test session, and real `jobd run` daemons.

Nothing here mocks Redis or processes: the server is a real redis-server on a free loopback
port in a temporary folder, and daemons are `python -m jobd run` subprocesses.
"""

from __future__ import annotations

import atexit
import inspect
import os
import shutil
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import redis
from support import DaemonProcess, LocalCluster, RedisServer

# JOBD_TEST_PREFETCH=N: every queue that does not set `prefetch` reads N entries ahead, in the
# daemons the tests start and in this process (tests/forced/sitecustomize.py).
if os.environ.get("JOBD_TEST_PREFETCH"):
    FORCED = str(Path(__file__).parent / "forced")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (FORCED, os.environ.get("PYTHONPATH")) if p
    )
    sys.path.insert(0, FORCED)
    from sitecustomize import force_prefetch

    force_prefetch(int(os.environ["JOBD_TEST_PREFETCH"]))


# The longest tests (tens of seconds each) go first: in the workers (`pytest -n 4`), one of them
# started last would run alone at the end.
LONGEST_FIRST = (
    "tests/test_stateful.py::",
    "tests/test_scaling.py::test_daemons_follow_a_sentinel_failover_under_load",
    "tests/test_bench.py::test_targets_bench_runs",
    "tests/test_scaling.py::test_three_daemons_on_a_three_master_cluster",
    "tests/test_install.py::test_the_install_script_into_a_temporary_prefix",
    "tests/test_embedded.py::test_an_embedded_redis_that_loads_for_a_while",
    "tests/test_hostile_entries.py::test_entries_of_a_million_empty_fields",
    "tests/test_periodic_retention_safety.py::test_two_daemons_with_clocks_30s_apart",
    "tests/test_cluster_migration.py::",
    "tests/test_containment.py::test_a_pid_freed_during_a_stops_scan",
    "tests/test_followups.py::test_a_parent_retried_after_its_first_success",
    "tests/test_chains.py::test_replies_cut_as_jobs_settle",
    "tests/test_cluster_failover.py::test_cluster_master_killed_under_load",
    "tests/test_outages.py::test_redis_outages_under_load_lose_nothing",
)


def pytest_configure(config: pytest.Config) -> None:
    """Bytecode. With PYTHONDONTWRITEBYTECODE set (some VMs and CI images set it), every `python
    -m jobd` the tests start compiled jobd's modules from source again, none cached: about 0.2 s
    of CPU a daemon and 0.1 s a command, hundreds of them a run. They keep it instead in a folder
    of pytest's cache (.pytest_cache/d/pycache, kept from run to run; without the cache, a
    temporary folder of the run's), never next to the sources, which the variable keeps clean.
    Set before the xdist workers start: they and all they start inherit it."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or "PYTHONPYCACHEPREFIX" in os.environ:
        return
    try:
        folder = str(config.cache.mkdir("pycache"))  # type: ignore[union-attr]
    except (AttributeError, OSError):  # -p no:cacheprovider, a read-only tree
        folder = tempfile.mkdtemp(prefix="jobd-tests-pycache-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ["PYTHONPYCACHEPREFIX"] = folder


# Tests that steer the pid of a process they start by writing /proc/sys/kernel/ns_last_pid: one
# such write is the whole pid namespace's, so two of them at once can hand each other's pid to a
# process of the other, for good (a stop CI's Valkey phase lost 20 s of tries to it). They run on
# one xdist worker, one after the other (``--dist loadgroup`` in pyproject's addopts).
PID_STEERING = ("ns_last_pid", "NS_LAST_PID", "session_leader_with_pid", "TAKES_A_PID")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not item.nodeid.startswith(LONGEST_FIRST))
    for item in items:
        function = getattr(item, "function", None)
        try:
            source = inspect.getsource(function) if function is not None else ""
        except (OSError, TypeError):
            continue
        scripts = [  # the module's scripts (handlers as text) that steer a pid themselves
            name
            for name, value in vars(getattr(item, "module", None) or object()).items()
            if isinstance(value, str) and "ns_last_pid" in value
        ]
        if any(word in source for word in (*PID_STEERING, *scripts)):
            item.add_marker(pytest.mark.xdist_group("ns_last_pid"))


def pytest_report_header() -> str | None:
    ahead = os.environ.get("JOBD_TEST_PREFETCH")
    return f"prefetch forced: {ahead} ahead where a queue does not set it" if ahead else None


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def r(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client on a flushed server: each test starts from an empty Redis."""
    client = redis.Redis(port=redis_server.port)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def write_config(tmp_path: Path, redis_server: RedisServer) -> Callable[..., Path]:
    """Write a config (YAML text, dedented) into the test's folder; ``{redis}`` is the URL."""

    def write(text: str, name: str = "jobd.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text).replace("{redis}", redis_server.url))
        return path

    return write


@pytest.fixture
def script(tmp_path: Path) -> Callable[[str, str], Path]:
    """Write an executable handler into the test's folder."""

    def make(name: str, body: str) -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(body).lstrip())
        path.chmod(0o755)
        return path

    return make


@pytest.fixture
def daemon(r: redis.Redis, tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    """Start daemons; every one still running at the end of the test is killed."""
    started: list[DaemonProcess] = []

    def start(
        config: Path,
        env: dict[str, str] | None = None,
        ready: bool = True,
        prefix: Sequence[str] = (),
    ) -> DaemonProcess:
        d = DaemonProcess(config, tmp_path, env, prefix)
        started.append(d)
        if ready:
            d.wait_ready()
        return d

    yield start
    for d in started:
        d.kill()
        print(f"--- log of daemon {d.proc.pid} ---\n{d.log()}")  # shown when the test fails


@pytest.fixture
def durable_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own, with AOF and appendfsync always: it can be stopped
    and started again on the same port without losing a write."""
    server = RedisServer(tmp_path / "redis", ("--appendonly", "yes", "--appendfsync", "always"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def _three_masters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("cluster"))
    c.start()
    yield c
    c.stop()


@pytest.fixture
def cluster(_three_masters: LocalCluster) -> LocalCluster:
    """A three-master Redis Cluster, flushed: one per session (it takes seconds to form), for
    the tests that neither stop nor reshard a node (those start their own)."""
    for server in _three_masters.servers:
        with redis.Redis(port=server.port) as client:
            client.flushall()
    return _three_masters
