"""A handler's own resources (issue 20, in part): `resources:` (the per-handler rlimits moved there
from `limits:`), `resources.memory` enforced by sampling the handler tree's resident memory
(outcome `memory`), and `resources.oom_score_adj`. Real daemons, real handlers, real Redis.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import redis
from support import DaemonProcess, jobd_cli, queue_config, wait_until

Daemon = Callable[..., DaemonProcess]

# Grows to 300 MB, a child of the handler (the tree is what counts), then waits to be stopped.
HOG = (
    "import subprocess, sys\n"
    "child = subprocess.Popen([sys.executable, '-c', "
    "'import time; b = b\"x\" * (300 << 20); time.sleep(60)'])\n"
    "child.wait()\n"
)


def test_a_tree_over_its_memory_cap_is_stopped_as_memory_and_others_run_on(
    r: redis.Redis, write_config, daemon: Daemon, tmp_path
) -> None:
    command = json.dumps([sys.executable, "-c", HOG])
    config = write_config(
        queue_config(command, resources="{memory: 64MiB}", retry="{max_attempts: 1}")
        + "  other: {command: [/bin/sh, -c, 'exit 0']}\n"
    )
    d = daemon(config)
    r.xadd("jobd:q", {"payload": "x", "job_id": "hog"})
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 1, what="the hog stopped and dead-lettered")
    ((_, record),) = r.xrange("{jobd:q}:dead")
    assert record[b"jobd_error"] == b"memory"
    d.wait_log("over resources.memory 64.0MiB; stopping it")
    for i in range(5):  # the daemon unharmed: other jobs run on
        r.xadd("jobd:other", {"payload": "x", "job_id": f"o{i}"})
    wait_until(lambda: r.hlen("{jobd:other}:history") == 5, what="the other queue's jobs")
    assert d.proc.poll() is None
    # Every process of the tree gone, within a bound: a SIGKILLed process leaves /proc when the
    # kernel has torn it down (under CI's load, after the other queue's jobs were recorded).
    wait_until(lambda: not [p for p in psutil.process_iter(["cmdline"]) if "300 << 20" in " ".join(
        p.info["cmdline"] or [])], 10, "the whole tree stopped")  # fmt: skip


def test_handlers_get_their_oom_score_adj(r: redis.Redis, write_config, daemon: Daemon) -> None:
    """Default 500 (the OOM killer picks a handler before jobd), or the queue's own."""
    config = write_config(
        queue_config("[/bin/sh, -c, 'cat /proc/self/oom_score_adj; exec sleep 30']")
        + "  own:\n    command: [/bin/sh, -c, 'cat /proc/self/oom_score_adj']\n"
        + "    resources: {oom_score_adj: 700}\n"
    )
    d = daemon(config)
    r.xadd("jobd:q", {"payload": "x", "job_id": "default"})
    r.xadd("jobd:own", {"payload": "x", "job_id": "own"})
    d.wait_log("queue=q job=default attempt=1 stdout: 500")
    d.wait_log("queue=own job=own attempt=1 stdout: 700")


def test_handlers_started_back_to_back_each_get_their_queues_oom_score(
    r: redis.Redis, write_config, daemon: Daemon
) -> None:
    """Handlers are started without the daemon waiting for their exec, and until then they
    share its memory: the kernel gives each process sharing it the score the daemon writes for
    itself. Two queues of different scores, started in turns: each handler still gets its
    queue's score, and the daemon gets its own back once they have started."""
    report = "[/bin/sh, -c, 'echo score=$(cat /proc/self/oom_score_adj)']"
    config = write_config(
        queue_config(report, concurrency=4)
        + f"  own:\n    command: {report}\n    concurrency: 4\n"
        + "    resources: {oom_score_adj: 700}\n"
    )
    d = daemon(config)
    own = Path(f"/proc/{d.proc.pid}/oom_score_adj").read_text().strip()
    pipe = r.pipeline(transaction=False)
    for i in range(60):
        pipe.xadd("jobd:q", {"payload": "x", "job_id": f"q{i}"})
        pipe.xadd("jobd:own", {"payload": "x", "job_id": f"own{i}"})
    pipe.execute()
    wait_until(lambda: d.log().count("stdout: score=") == 120, what="every handler's score")
    scores = {
        (line.split("queue=")[1].split()[0], line.rsplit("score=", 1)[1])
        for line in d.log().splitlines()
        if "stdout: score=" in line
    }
    assert scores == {("q", "500"), ("own", "700")}
    wait_until(
        lambda: Path(f"/proc/{d.proc.pid}/oom_score_adj").read_text().strip() == own,
        what="the daemon's own score back",
    )


def test_per_handler_limits_moved_to_resources(write_config) -> None:
    """The old names under `limits:` are refused, saying where they went; `resources:` takes
    them, and `jobd validate` says which containment applies."""
    old = write_config(queue_config("[/bin/true]", limits="{address_space: 256MiB}"))
    out = jobd_cli("validate", str(old))
    assert out.returncode == 78
    assert b"limits.address_space: unknown key 'address_space'; moved to resources.address_space" in (
        out.stdout
    )  # fmt: skip
    new = write_config(
        queue_config("[/bin/true]", resources="{address_space: 256MiB, memory: 1GiB}")
    )
    out = jobd_cli("validate", str(new))
    assert out.returncode == 0, out
    lines = out.stdout.decode().splitlines()
    assert "containment: each handler in a session of its own" in lines[0]
    assert lines[1].startswith("resources.memory of q: ") and "sampled every 0.5s" in lines[1]


def test_a_tree_stopped_for_memory_is_not_done_even_if_it_exits_0(
    r: redis.Redis, write_config, daemon: Daemon, tmp_path
) -> None:
    """A handler that shuts down gracefully on SIGTERM (exit 0) was stopped for its memory: the
    outcome is `memory`, never an ack."""
    handler = tmp_path / "graceful.sh"
    handler.write_text(
        "#!/bin/sh\n"
        f"{sys.executable} -c 'import time; b = b\"x\" * (300 << 20); time.sleep(60)' &\n"
        "child=$!\ntrap 'kill $child; exit 0' TERM\nwait\n"
    )
    handler.chmod(0o755)
    config = write_config(
        queue_config(f"[{handler}]", resources="{memory: 64MiB}", retry="{max_attempts: 1}")
    )
    daemon(config)
    r.xadd("jobd:q", {"payload": "x", "job_id": "graceful"})
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 1, what="dead-lettered as memory")
    ((_, record),) = r.xrange("{jobd:q}:dead")
    assert record[b"jobd_error"] == b"memory" and record[b"jobd_exit_code"] == b"0"


def test_memory_that_escaped_the_group_counts_against_its_job(
    r: redis.Redis, write_config, daemon: Daemon, tmp_path
) -> None:
    """The 300 MB is a daemonized grandchild (setsid, jobd's child by then): still the job's."""
    handler = tmp_path / "sneaky.sh"
    hog = f"{sys.executable} -c 'import time; b = b\\\"x\\\" * (300 << 20); time.sleep(60)'"
    handler.write_text(  # a double fork: the hog is orphaned at once, adopted by jobd
        f'#!/bin/sh\nsetsid sh -c "{hog} </dev/null >/dev/null 2>&1 &"\nsleep 30\n'
    )
    handler.chmod(0o755)
    config = write_config(
        queue_config(f"[{handler}]", resources="{memory: 64MiB}", retry="{max_attempts: 1}")
    )
    daemon(config)
    r.xadd("jobd:q", {"payload": "x", "job_id": "sneaky"})
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 1, what="dead-lettered as memory", timeout=20)
    ((_, record),) = r.xrange("{jobd:q}:dead")
    assert record[b"jobd_error"] == b"memory"


def test_a_score_refused_for_one_queue_leaves_the_others_and_a_changed_own_score(
    r: redis.Redis, write_config, daemon: Daemon
) -> None:
    """Lowering needs CAP_SYS_RESOURCE: a queue asking -100 keeps the daemon's score, and the
    next queue still gets its 500; an operator's new score for the daemon stays."""
    command = "[/bin/sh, -c, 'cat /proc/self/oom_score_adj']"
    config = write_config(
        queue_config(command) + f"  low:\n    command: {command}\n"
        "    resources: {oom_score_adj: -100}\n"
    )
    d = daemon(config)
    try:
        with open(f"/proc/{d.proc.pid}/oom_score_adj", "w") as f:
            f.write("-100")
        pytest.skip("this process may lower scores (CAP_SYS_RESOURCE): nothing is refused here")
    except PermissionError:
        pass
    r.xadd("jobd:low", {"payload": "x", "job_id": "low"})
    d.wait_log("queue=low job=low attempt=1 exit 0 after")
    r.xadd("jobd:q", {"payload": "x", "job_id": "normal"})
    d.wait_log("queue=q job=normal attempt=1 stdout: 500")
    with open(f"/proc/{d.proc.pid}/oom_score_adj", "w") as f:
        f.write("300")
    r.xadd("jobd:q", {"payload": "x", "job_id": "again"})
    d.wait_log("queue=q job=again attempt=1 stdout: 500")
    with open(f"/proc/{d.proc.pid}/oom_score_adj") as f:
        assert f.read().strip() == "300", "the daemon's new score stays"


def test_rlimits_without_prlimit_name_the_resources_key(write_config) -> None:
    config = write_config(queue_config("[/bin/true]", resources="{open_files: 64}"))
    out = jobd_cli("validate", str(config), env={"PATH": "/nonexistent"})
    assert out.returncode == 78, out
    assert b"queues.q.resources: address_space, open_files and cpu_time need prlimit(1)" in (
        out.stdout
    )  # fmt: skip
