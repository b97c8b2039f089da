"""Review 36q of issue 36: a priority queue's figures over its levels (``status.over_levels``,
36p: 0dd8bb2, 02ffd3e) count a level's unreadable delayed set as 0. ``queue_status`` says
``delayed: None`` where Redis answered an error (a key of another type at the set's name), and
``jobd status`` prints it "-" (``_count``: "'-' where Redis answered an error"); the queue page
prints it "–". But ``over_levels`` sums ``b["delayed"] or 0``: the queue's own line then states a
definite count that leaves the unreadable level out, as if it held none, and the queue page's
"delayed" figure the same. Its own docstring says the sums are "None when a level's is not
known"; only the lag follows it.

Reproduced: ``priorities: [high, low]`` (``low`` the default), two jobs in ``high``'s delayed
set, a string at ``low``'s delayed set's name: ``render(gather(...))`` says "level low: ...
delayed -" and, for the queue, "delayed 2"; ``over_levels`` gives 2 (and so does the queue
page, ``pages.queue_page``, which updates its report with it). Before 36p, the queue's line
(its default level's figure) said "delayed -".

What should happen: a sum over levels one of which cannot be read is not given as a plain count:
None ("-"), or marked as a lower bound, as the lag is ("-(≤N)"). Suggested fix: in
``over_levels``, ``"delayed": None if any(b["delayed"] is None for b in levels) else sum(...)``
(the text and the page already print None as "-"/"–").

Fixed (store/status.py over_levels): the delayed sum is None when a level's is not known, as
the lag's is: `jobd status` and the queue page say "-" for it.
"""

from __future__ import annotations

import re
from typing import Any

import redis
from support import queue_config


def test_a_levels_unreadable_delayed_set_is_not_summed_as_zero(
    r: redis.Redis, write_config: Any
) -> None:
    from jobd.cli.status import render
    from jobd.config import load
    from jobd.store import status
    from jobd.store.status import gather

    config = load(str(write_config(queue_config("[/bin/true]", priorities="[high, low]"))))
    q = config.queues["q"]
    levels = {level.priority: level for level in q.all_levels()}
    for level in levels.values():  # as a daemon's reader makes them (ensure_group)
        r.xgroup_create(level.stream, level.group, id="0", mkstream=True)
    r.zadd(levels["high"].keys.delayed, {"job-a": 1, "job-b": 2})
    r.set(levels["low"].keys.delayed, "someone else's")  # unreadable: WRONGTYPE
    report = gather(r, config)
    s = report["queues"]["q"]
    assert s["levels"]["low"]["delayed"] is None  # the level's own figure: not known
    summed = status.over_levels(s)["delayed"]
    text = render(report)
    queue_line = next(line for line in text.splitlines() if line.startswith("  length "))
    shown = re.search(r"delayed (\S+)", queue_line)
    assert shown is not None, text
    assert summed is None and not shown.group(1).isdigit(), (
        f"the 'low' level's delayed set cannot be read (its own line says '-'), yet the queue's "
        f"figure over its levels is a plain count: over_levels gives {summed!r}, and "
        f"`jobd status` says {queue_line.strip()!r}:\n{text}"
    )
