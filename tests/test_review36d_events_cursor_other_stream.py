"""Review 4 of issue 36: the feed's first cursor gives a queue another stream's id, starving it.

Without ``after`` (the page's first poll, and after every ``skipped``), ``events_feed`` sets
every queue's cursor to the oldest event returned, whichever queue's stream it is of
(``after = {q.name: oldest for q in queues}``), and only the queues with events in the reply
get their own. Stream ids are per stream: one queue's events stream may be ahead of Redis's
clock (its last id stays where it was after Redis's clock stepped back, a failover to a replica
whose clock is behind, or an entry added with an explicit id), and then every queue without an
event in the first reply gets a cursor in the future: its events are left out of every poll
until Redis's clock passes it, with ``skipped`` false.

Two queues; q0's events stream holds one event an hour ahead; q1 none yet. The page's first
poll, then q1's pause (a real `jobd pause`: an event in q1's stream), then the next poll.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis
from support import dashboard_server, events_after, get_json, jobd_cli, queues_config


def test_a_queue_without_events_gets_a_cursor_from_another_stream(
    r: redis.Redis, write_config: Any, tmp_path: Path
) -> None:
    config = write_config(queues_config(2))
    seconds, _ = r.time()
    ahead = f"{(int(seconds) + 3600) * 1000}-0"  # an hour ahead of Redis's clock
    r.xadd("{jobd:q0}:events", {"event": "done", "queue": "q0", "job": "j"}, id=ahead)
    with dashboard_server(config) as port:
        first = get_json(port, "/api/events")
        assert jobd_cli("pause", "-c", str(config), "q1").returncode == 0
        [paused] = r.xrange("{jobd:q1}:events")
        second = events_after(port, first["after"])
    shown = [(e["queue"], e["id"]) for e in second["events"]]
    # Expected: q1's pause shows at the next poll (its cursor: before any of q1's events).
    assert ("q1", paused[0].decode()) in shown, (
        f"first cursor {first['after']}; next poll gave {shown}, skipped {second['skipped']}"
    )
