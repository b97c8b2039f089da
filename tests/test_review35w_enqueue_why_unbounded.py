"""Review 35w of issue 35 (low): the why of a refused JOBD_ENQUEUE file quotes the handler's
text whole (a queue name, an unknown key, a job id: ``{name!r}`` in process/followups.py and
jobd/ndjson.py), so a line of one long name (here a 1 MiB queue name; a file may hold 64 MiB)
pushes everything else out of the dead letter's ``jobd_stderr`` (its last 4096 bytes,
store/outcomes.py STDERR_LIMIT): which line was refused ("JOBD_ENQUEUE line N:"), what kind of
refusal, and the handler's own stderr are all gone; what is left is 4 KiB of the name and
"' is not in the config".

Reproduce: a handler that writes "oops" on stderr and one line {"queue": "q…q" (2**20 q's),
"payload": "x"} into $JOBD_ENQUEUE, exit 0; one daemon; `jobd enqueue p x --job-id p1`; the
dead letter's jobd_stderr is "qqqq…q' is not in the config".

What should happen: docs/workflows.md: a file jobd will not take dead-letters the job "with
`jobd_error=enqueue` and why at the end of `jobd_stderr`", e.g. "JOBD_ENQUEUE line 2: unknown
key 'delya'": the why says its line and reason whatever the handler wrote, and leaves the
handler's stderr tail room. Suggested fix: quote at most some 200 characters of a value in
these messages (a ``shown(value)`` that cuts with "…" and the length), or cut the why itself
to e.g. 1 KiB keeping its head, before ``decide`` appends it to the detail.

Fixed (fixer f35wa): process/followups.py ``brief`` keeps the first 240 and the last 120
characters of a why longer than 480, saying how many were cut between, so the line's number,
its reason and the handler's stderr stay in jobd_stderr.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess
from test_review35w_enqueue_why_history import dead_parent

Daemon = Callable[..., DaemonProcess]


def test_a_long_name_in_a_refused_line_leaves_the_why_readable(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    lines = tmp_path / "follow-ups"
    lines.write_bytes(b'{"queue": "' + b"q" * 2**20 + b'", "payload": "x"}\n')
    handler = f'#!/bin/sh\ncat > /dev/null\necho oops >&2\ncat {lines} > "$JOBD_ENQUEUE"\n'
    dead = dead_parent(r, write_config, script, daemon, handler)[1]
    assert dead[b"jobd_error"] == b"enqueue"
    stderr = dead[b"jobd_stderr"]
    assert stderr.endswith(b"is not in the config"), stderr[-100:]
    assert b"JOBD_ENQUEUE line 1: queue " in stderr, stderr[:100]
    assert b"oops" in stderr, stderr[:100]
