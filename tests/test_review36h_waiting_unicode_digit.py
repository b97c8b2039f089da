"""Review 36h of issue 36: one value in a queue's "waiting" hash takes the overview, the queue's
page and `jobd status` down.

The consumers waiting for a limit (``{jobd:Q}:waiting``, consumer -> "REASON SINCE_MS",
written by acquire.lua) are read with every field (``status.read_hashes``: '*', to a bound),
and each value is parsed by ``status._waiting``: ``since.isdigit()`` then ``int(since)``. On a
``str``, ``isdigit()`` is true of Unicode digits that ``int()`` refuses (U+00B2 SUPERSCRIPT TWO,
"²"): the ValueError escapes, and ``/api/summary`` (every queue of the overview) and
``/api/queue`` answer 500 "the dashboard failed", `jobd status` exits with a traceback, for as
long as that field stays (anyone who can write to Redis: one HSET of 8 bytes). The daemon's
status report (``report.StatusReport.tick``, the same ``queue_status``) fails likewise at each
tick (read in the code, not tested here): the queue gauges of that queue and of those after it,
and systemd's STATUS line, stop being updated.

What should happen: a value jobd would not have written is left out (``_waiting`` already
returns None for "anything else"), the pages answer 200 and `jobd status` exits 0. It matters
because the overview is what an operator runs an incident from, and the hash is open to anyone
who can write to Redis (its field names are consumers' names, its values any bytes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis
from support import dashboard_server, get_status, jobd_cli, queues_config

from jobd import config as jobd_config


def test_a_superscript_digit_in_the_waiting_hash_fails_the_pages_and_status(
    r: redis.Redis, write_config: Any, tmp_path: Path
) -> None:
    config = write_config(queues_config(2))
    qkeys = jobd_config.load(str(config)).queues["q0"].keys
    r.hset(qkeys.waiting, "someone-1-abcd", "slots ²".encode())  # isdigit(), not int()
    with dashboard_server(config) as port:
        replies = {path: get_status(port, path) for path in ("/api/summary", "/api/queue?queue=q0")}
    status = jobd_cli("status", "-c", str(config))
    # Expected: the value is not jobd's and is left out; the pages and the status still answer.
    assert all(code == 200 for code, _ in replies.values()), replies
    assert status.returncode == 0, status.stderr[-400:]


def test_the_same_parse_elsewhere_takes_ascii_digits_only() -> None:
    """The same pattern (``str.isdigit`` then ``int``) where jobd read a number from the
    environment, a cgroup's name or Redis: a Unicode digit is no number, never a ValueError."""
    from jobd.daemon.notify import Notifier
    from jobd.logs import to_journal
    from jobd.process.owners import pid_of

    assert (
        Notifier.from_environ({"WATCHDOG_USEC": "²", "WATCHDOG_PID": "1"}).watchdog_interval is None
    )
    assert Notifier.from_environ({"WATCHDOG_USEC": "4000000"}).watchdog_interval == 2.0
    Notifier.from_environ({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "²"})  # no ValueError
    assert to_journal(environ={"JOURNAL_STREAM": "²:1"}) is False
    assert pid_of("jobd-²-abcd-1") is None
    assert pid_of("jobd-12-abcd-1") == 12
