"""Review 36m of issue 36: while Redis does not answer, the dashboard's summary requests are
made one after another, each waiting the whole socket timeout again: the third of three
browsers asking for /api/summary at once is told "cannot reach Redis" after ~30 s, not 10 s,
and the page's four workers are held meanwhile (every other page request waits behind them).

Review 36l's fix paces /api/summary and /api/overview (``dashboard.Dashboard.paced``, a
``paced.Paced`` with keep 0): ``Paced.get`` (jobd/web/paced.py:48-62) renders under one lock,
and the requests waiting for it share the render only when it *answered*: a render that raises
(``redisconn.UNAVAILABLE`` after ``connection.SOCKET_TIMEOUT``, 10 s) keeps nothing, so each
waiter, taking the lock in turn, renders again and waits its own 10 s. Before the pace the
requests waited on their workers side by side: every one answered 503 after ~10 s. The same
happens with a Redis that answers slowly (a long script, a busy master): the renders that
made the page wait add up instead of overlapping, and the dashboard's refresh (every 5 s, one
request per open page) piles up behind them.

What should happen: each request is answered (here 503, "cannot reach Redis") within the
socket timeout and a little, however many ask at once (suggested: a failed render is shared by
the requests that waited for it, as an answer is; or the lock is not held across Redis).

A private Redis of the test's own, stopped with SIGSTOP (continued before the test ends); the
dashboard is served in this process (``server.serve_app``), asked by three threads at once.
"""

from __future__ import annotations

import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from support import RedisServer, free_port, wait_until

from jobd.config import load
from jobd.store import connection
from jobd.web import server
from jobd.web.dashboard import Dashboard

BROWSERS = 3
WITHIN = connection.SOCKET_TIMEOUT + 3.0  # the socket timeout, and a little


def summary(port: int) -> tuple[object, float]:
    """GET /api/summary: (status or error, seconds)."""
    began = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/summary", timeout=120) as got:
            status: object = got.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except OSError as exc:
        status = type(exc).__name__
    return status, round(time.monotonic() - began, 2)


def test_summaries_asked_at_once_while_redis_is_stalled_fail_together(
    durable_redis: RedisServer, tmp_path: Path
) -> None:
    path = tmp_path / "jobd.yaml"
    path.write_text(
        f"redis: {{url: '{durable_redis.url}'}}\nqueues:\n"
        + "".join(f"  q{i}: {{command: [/bin/true]}}\n" for i in range(5))
    )
    page = Dashboard(load(str(path)))
    port = free_port()
    served = server.serve_app(page, f"127.0.0.1:{port}", "review36m")
    seen: list[tuple[object, float]] = []
    assert durable_redis.proc is not None
    try:
        wait_until(lambda: summary(port)[0] == 200, what="the dashboard to answer")
        durable_redis.proc.send_signal(signal.SIGSTOP)
        try:
            asks = [threading.Thread(target=lambda: seen.append(summary(port)))
                    for _ in range(BROWSERS)]  # fmt: skip
            for ask in asks:
                ask.start()
            for ask in asks:
                ask.join(150)
        finally:
            durable_redis.proc.send_signal(signal.SIGCONT)
    finally:
        served.shutdown()
    late = [s for s in seen if s[1] > WITHIN]
    assert len(seen) == BROWSERS and not late, (
        f"{len(late)} of {BROWSERS} /api/summary requests asked at once while Redis was "
        f"stalled took over {WITHIN} s: {sorted(seen, key=lambda s: s[1])}"
    )
