"""Review 35w of issue 35 (low): a parent dead-lettered `enqueue` (its JOBD_ENQUEUE file refused)
has no ``detail`` in its history record, and `jobd job` never says why; docs/workflows.md says
why is "at the end of `jobd_stderr` (and of its history record's `detail`)".

What is wrong: store/notes.py ``note`` writes a record's ``detail`` for a job that never ran,
and for a refused result (``o.error == RESULT``: the detail's last line, "jobd: …"), but not
for ``ENQUEUE``, whose why (process/policy.py ``decide``: ``detail + "\\njobd: " + why``) is
only in the dead letter's jobd_stderr. `jobd job p p1` shows "error: enqueue" and the
handler's stderr, nothing of which line was refused or why; the dead letter, where the why
is, is trimmed (dead_letter.maxlen) or requeued long before the history's bounds pass.

Reproduce: a handler that writes "oops" on stderr and `{"queue": "nope", "payload": "x"}` into
$JOBD_ENQUEUE, exit 0; one daemon; `jobd enqueue p x --job-id p1`; HGET {jobd:p}:history p1:
the record has stderr "oops\\n", error "enqueue", no detail.

What should happen: the record's ``detail`` is the why, as for a refused result: "JOBD_ENQUEUE
line 1: queue 'nope' is not in the config", and `jobd job` shows it. Suggested fix: in
``notes.note``, ``if o.error in (RESULT, ENQUEUE)`` (both append "\\njobd: WHY" to the detail).

Fixed (fixer f35wa): ``notes.note`` writes the detail's last line for ``ENQUEUE`` as for
``RESULT``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson
import redis
from support import DaemonProcess, jobd_cli, wait_until

Daemon = Callable[..., DaemonProcess]

PARENT = """\
#!/bin/sh
cat > /dev/null
echo oops >&2
echo '{"queue": "nope", "payload": "x"}' > "$JOBD_ENQUEUE"
"""


def dead_parent(
    r: redis.Redis, write_config, script, daemon: Daemon, handler: str
) -> tuple[Path, dict[bytes, bytes]]:
    """Queue p, whose handler is ``handler`` (its text), and queue t; one daemon; job p1
    enqueued on p and dead-lettered: the config and p1's dead letter."""
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  p:\n    command: [{script('parent.sh', handler)}]\n"
        "  t:\n    command: [/bin/true]\n"
    )
    daemon(cfg)
    assert jobd_cli("enqueue", "-c", str(cfg), "p", "x", "--job-id", "p1").returncode == 0
    wait_until(lambda: r.xlen("{jobd:p}:dead") == 1, 20, what="p1 dead-lettered")
    return cfg, r.xrange("{jobd:p}:dead")[0][1]


def test_the_why_of_a_refused_follow_up_file_is_in_the_history_record(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    cfg, dead = dead_parent(r, write_config, script, daemon, PARENT)
    why = "JOBD_ENQUEUE line 1: queue 'nope' is not in the config"
    assert dead[b"jobd_error"] == b"enqueue" and dead[b"jobd_stderr"].endswith(why.encode())
    wait_until(lambda: r.hget("{jobd:p}:history", "p1") is not None, 10, what="p1's record")
    record = orjson.loads(r.hget("{jobd:p}:history", "p1"))
    assert record["error"] == "enqueue"
    assert record.get("detail") == why, record
    shown = jobd_cli("job", "-c", str(cfg), "p", "p1").stdout.decode()
    assert why in shown, shown
