"""Review 36h of issue 36: two daemons with the same host name and pid are listed as one.

A daemon's name, in the registry and in every consumer group, was ``HOST-PID-XXXX``
(``lease.consumer_name``): 16 random bits past the host name and pid. Containers often share
both (a fixed ``hostname:`` in a compose file or a swarm service with replicas, host
networking; jobd as the entrypoint: pid 1 in each), and among n such daemons two draw the same
16 bits with a probability of about n²/2¹⁷: 7 % for a fleet of 100 at each restart. Nothing
noticed: beat.lua wrote both daemons' beats into the one record (``HSETNX started``, the rest
overwritten in turn), ``jobd status`` and the dashboard's Daemons list showed one daemon where
two run, the overview's slots counted one, and when either stopped cleanly its ``deregister``
removed the record of the one still running (and the group's consumer both hold jobs under).
Reproduced here with two real daemons, each in a PID and UTS namespace of its own (``worker``,
pid 1), their draws made equal (``secrets.token_hex`` called by ``consumer_name``, the only
thing patched).

Fixed: the name has 64 random bits (n²/2⁶⁵: none in any fleet's lifetime), and a clash all the
same is found: each beat says which process wrote it (an instance token of its own), one that
finds the record written by another marks it, and the listing says so (the daemon's problems,
the registry's error) as long as the mark is recent. The fix's first version of this test
patched the 16-bit draw alone (``token_hex(2)``); the draw is now ``token_hex(8)``, and other
code draws 8 bytes too (delayed members' ids, the channel's name), so the patch now answers only
``consumer_name``'s call.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from support import DaemonProcess, jobd_cli, queue_config, wait_until

from jobd.daemon import lease

Daemon = Callable[..., DaemonProcess]
SAME_DRAW = """\
import secrets
import sys

_token_hex = secrets.token_hex


def token_hex(nbytes=None):
    if sys._getframe(1).f_code.co_name == "consumer_name":
        return "abcd" * (nbytes // 2)  # the name's draw, the same each time
    return _token_hex(nbytes)


secrets.token_hex = token_hex
"""
NAME = "worker-1-" + "abcd" * 4
# Each daemon in a container of its own, as far as its name goes: host name "worker", pid 1.
CONTAINER = ["unshare", "--pid", "--fork", "--mount-proc", "--uts", "--kill-child",
             "sh", "-c", 'hostname worker && exec "$0" "$@"']  # fmt: skip


def _namespaces_allowed() -> bool:
    if shutil.which("unshare") is None:
        return False
    done = subprocess.run([*CONTAINER, "true"], capture_output=True, timeout=10)
    return done.returncode == 0


@pytest.mark.skipif(not _namespaces_allowed(), reason="needs unshare with PID and UTS namespaces")
def test_two_daemons_drawing_the_same_name_are_listed_as_one(
    r: redis.Redis, write_config: Any, daemon: Daemon, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SAME_DRAW)
    env = {"PYTHONPATH": f"{site}:{os.environ.get('PYTHONPATH', '')}"}
    config = write_config(queue_config("[/bin/true]"))
    first = daemon(config, env=env, prefix=CONTAINER)
    second = daemon(config, env=env, prefix=CONTAINER)
    assert first.consumer() == second.consumer() == NAME  # the clash reproduced
    assert first.proc.poll() is None and second.proc.poll() is None  # both run

    def status() -> dict[str, Any]:
        done = jobd_cli("status", "-c", str(config), "--json")
        return json.loads(done.stdout)

    def said() -> bool:  # the second daemon's first beat finds the first's record
        report = status()
        return len(report["daemons"]) == 2 or bool(report["daemons_error"])

    wait_until(said, timeout=15, what="jobd status to list two daemons or say their names clash")
    report = status()
    [listed] = report["daemons"]
    assert listed["name"] == NAME and listed["clash"], listed
    assert any("more than one process" in p for p in listed["problems"]), listed
    assert "names clash" in report["daemons_error"], report["daemons_error"]


def test_a_daemon_name_has_64_random_bits() -> None:
    names = {lease.consumer_name() for _ in range(2)}
    tails = {name.rsplit("-", 1)[1] for name in names}
    assert len(names) == 2 and all(
        len(t) == 16 and set(t) <= set("0123456789abcdef") for t in tails
    ), names
