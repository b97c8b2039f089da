"""Review 36i of issue 36: ``//healthz`` is answered as /healthz, but by the dashboard's workers.

Review 36h gave /healthz and /metrics workers of their own (``server.PROBE_WORKERS``), chosen
by the request's path as waitress parsed it (``_WSGIServer.add_task``: ``request.path in
apart``). The app answers by ``PATH_INFO``, which waitress makes from the same path with its
leading slashes squeezed to one (``task.get_environment``: ``"/" + path.lstrip("/")``). So a
request for ``//healthz`` (a probe URL joined as ``http://host:port/`` + ``/healthz``, a common
slip in templated checks) or ``///metrics`` is answered by /healthz's code, 200 "ok", but routed
to the dashboard's 4 workers: while Redis is unreachable and an open page's requests hold them
(each up to the 10 s socket timeout), that probe waits behind them just as before the fix, and a
liveness probe restarts a healthy daemon, killing its jobs, in the incident the page was opened
for.

What should happen: the request goes to the workers of the path the app will answer (route by
the same path as ``PATH_INFO``: the leading slashes squeezed), so ``//healthz`` answers within
the 2 s any /healthz answers in, whatever the page's requests wait for.

It is also review 36h's reproduction (its own test file folded in here, the same walk), which
found /healthz itself behind the page:

Review 36h of issue 36: while Redis is unreachable, an open dashboard keeps the daemon's
/healthz from answering.

The daemon serves /metrics, /healthz and the dashboard from one waitress server with 4 workers
(``server.WORKERS``), first come first served. /healthz needs no Redis and answers at once
(its 503 is for a main loop stuck 10 s; a main loop that waits for Redis with backoff is
live). But a dashboard request waits for Redis up to the socket timeout (10 s a call) when
Redis is cut off (a partition, a failover, a stopped server), and the page polls every second
from every open tab: 8 requests of the page held every worker for 20 s, and /healthz, sent
behind them, answered after 19.5 s (alone, during the same partition: 0.0 s). A liveness probe
(Kubernetes' default timeout is 1 s, failureThreshold 3) fails for as long as the tabs stay
open and restarts a daemon that is fine, killing its running jobs, in the very incident the
dashboard was opened for. docs/security.md says a client on the metrics port cannot "starve
/healthz".

What should happen: /healthz (and /metrics, which reads no Redis either) answers promptly
whatever the dashboard's requests wait for: a worker (or the loop thread) kept for them, or
the dashboard's requests bounded to fewer workers than the server has, or its Redis calls given
a short timeout while Redis is known away.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis
from faultproxy import FaultProxy
from support import DaemonProcess, free_port, wait_until
from test_dashboard_security import answers, request

Daemon = Callable[..., DaemonProcess]
PAGES = 8  # dashboard requests in flight
HEALTHZ_WITHIN = 2.0  # seconds /healthz may take (test_dashboard_security's bound)


def _answered(port: int, path: str, timeout: float) -> int | str:
    try:
        return request(port, path, timeout=timeout)[0]
    except OSError as exc:
        return repr(exc)


def test_double_slash_healthz_answers_while_dashboard_requests_wait_for_redis(
    r: redis.Redis, write_config: Any, daemon: Daemon, redis_server: Any
) -> None:
    port = free_port()
    with FaultProxy(redis_server.port) as proxy:
        config = write_config(
            f"redis: {{url: '{proxy.url}'}}\nqueues:\n  q0: {{command: [/bin/true]}}\n"
            f"metrics: {{listen: '127.0.0.1:{port}'}}\n"
        )
        daemon(config)
        wait_until(lambda: answers(port), what="the metrics server to answer")
        # The app answers //healthz as /healthz.
        status, _, body = request(port, "//healthz", timeout=10)
        assert (status, body) == (200, b"ok\n")
        proxy.blackhole(None)  # Redis cut off
        assert _answered(port, "//healthz", HEALTHZ_WITHIN) == 200  # alone: at once
        connections = proxy.connections()
        with ThreadPoolExecutor(PAGES) as pool:
            pages = [pool.submit(_answered, port, "/api/summary", 60) for _ in range(PAGES)]
            wait_until(lambda: proxy.connections() >= connections + 3,
                       what="the dashboard's requests to reach Redis")  # fmt: skip
            plain = _answered(port, "/healthz", HEALTHZ_WITHIN)
            doubled = _answered(port, "//healthz", HEALTHZ_WITHIN)
            proxy.restore()
            [p.result() for p in pages]
    assert plain == 200, f"/healthz behind {PAGES} dashboard requests: {plain}"
    assert doubled == 200, (
        f"//healthz (answered as /healthz) behind {PAGES} dashboard requests: {doubled}"
    )
