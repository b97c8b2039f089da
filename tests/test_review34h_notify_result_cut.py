"""Review 34h: ``jobd notify --result TEXT`` with a result within the queue's ``result_max``
(default 64 KiB) but whose message is over the channel's 64 KiB (``channel.MESSAGE_MAX``:
"X_JOBD_RESULT=" and 65 530 bytes) is sent whole; the daemon reads it cut (MSG_TRUNC) and drops
it as ``truncated``, then closes the pipe end it brought, and `jobd notify` exits 0: "read". The
job ends done with no result, `jobd enqueue --wait` prints nothing and exits 0: the result is
lost and nothing the handler or the producer sees says so (only
``jobd_notify_dropped_total{reason="truncated"}``). docs/handlers-talking-back.md: `jobd notify`
"returns once jobd has read it: exit 0; 1 when … the message cannot be sent".

What should happen: `jobd notify` refuses a message the daemon cannot take whole (exit 1 or 2,
saying to use JOBD_RESULT for more), or the daemon takes it: either way the handler (or the
producer) is not told that a lost result was delivered.

Real daemon, a sh handler with `jobd notify`, `jobd enqueue --wait`, a private Redis."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli

Daemon = Callable[..., DaemonProcess]
ROOT = Path(__file__).resolve().parent.parent
if not (ROOT / "jobd").is_dir():  # run from tests/open
    ROOT = ROOT.parent
SIZE = 65530  # under result_max (65 536), the message ("X_JOBD_RESULT=" and it) over 64 KiB


def test_a_result_jobd_notify_says_was_read_is_the_jobs_result(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    handler = script(
        "h.sh",
        f"""\
        #!/bin/sh
        cat >/dev/null
        big=$(head -c {SIZE} /dev/zero | tr '\\0' x)
        PYTHONPATH={ROOT} {sys.executable} -m jobd notify --result "$big"
        echo $? > {tmp_path}/rc
        """,
    )
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n  q:\n"
        f"    command: [{handler}]\n    retry: {{max_attempts: 1}}\n"
    )
    daemon(cfg)
    out = jobd_cli("enqueue", "-c", str(cfg), "q", "", "--job-id", "big", "--wait",
                   "--wait-timeout", "30s")  # fmt: skip
    rc = (tmp_path / "rc").read_text().strip()
    if rc != "0":
        return  # refused, and the handler knows
    assert out.returncode == 0, out.stderr
    assert len(out.stdout) == SIZE, (
        f"`jobd notify --result` ({SIZE} bytes, under result_max) exited 0, yet the job's "
        f"result is {len(out.stdout)} bytes: its message was dropped as truncated"
    )
