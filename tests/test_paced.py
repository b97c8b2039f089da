"""``jobd.web.paced``: the renders the web workers make on a daemon's process (/metrics, the
dashboard's summaries) take a bounded share of a CPU however many clients ask, are shared by
the requests waiting for them, and a kept answer is never served past its ``keep``.

Review 36l: a client asking for /metrics on 2 connections again and again slowed a daemon's
jobs 6 to 17 times (each request rendered 50 queues' series on the daemon's process); the
daemon-level reproduction is tests/test_review36l_metrics_flood_starves_jobs.py.
"""

from __future__ import annotations

import gzip
import threading
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from support import wait_until

from jobd.web import paced
from jobd.web.endpoint import paced_metrics
from jobd.web.paced import Paced, Spaced

BURN = 0.01  # seconds of CPU one render takes here
CALLERS = 6


def _burn() -> float:
    """A render taking BURN seconds of this thread's CPU; returns that CPU time."""
    began = time.thread_time()
    while time.thread_time() - began < BURN:
        pass
    return time.thread_time() - began


def test_renders_take_at_most_their_share_of_a_cpu_however_many_ask() -> None:
    pace: Paced[float] = Paced()
    spent: list[float] = []
    lock = threading.Lock()
    end = time.monotonic() + 1.0

    def ask(who: int) -> None:
        n = 0
        while time.monotonic() < end:
            n += 1
            cpu = pace.get((who, n), _burn)  # a key of its own: never shared, always rendered
            with lock:
                spent.append(cpu)

    began = time.monotonic()
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(CALLERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - began
    # Each render waits 1 / SHARE - 1 times the last one's CPU: at most SHARE of the time
    # (one render more may begin just before the end; each may overrun BURN a little).
    assert sum(spent) <= paced.SHARE * elapsed + 3 * BURN, (
        f"{len(spent)} renders took {sum(spent):.2f} s of CPU in {elapsed:.2f} s "
        f"({CALLERS} callers asking without a pause)"
    )
    assert len(spent) >= 5  # the callers are answered all along, not starved


def test_the_requests_waiting_for_a_render_share_the_next_one() -> None:
    asked: set[int] = set()  # the threads that read the clock: each reads it first as it asks
    everyone_asked = threading.Event()

    def clock() -> float:
        asked.add(threading.get_ident())
        if len(asked) == CALLERS + 1:
            everyone_asked.set()
        return time.monotonic()

    pace: Paced[int] = Paced(clock=clock)
    renders: list[int] = []

    def render() -> int:
        renders.append(len(renders))
        if len(renders) == 1:  # the others ask meanwhile (waiting for Redis, as a summary may)
            assert everyone_asked.wait(10)
        return len(renders)

    answers: list[int] = []

    def ask() -> None:
        answers.append(pace.get("summary", render))

    first = threading.Thread(target=ask)
    first.start()
    while not renders:  # the first render under way before the others ask
        time.sleep(0.01)
    others = [threading.Thread(target=ask) for _ in range(CALLERS)]
    for t in others:
        t.start()
    for t in [first, *others]:
        t.join()
    # The first render began before the others asked: none of them is given it (keep 0: an
    # answer never older than its request); the next one, begun after they all asked, serves all.
    assert len(renders) == 2 and sorted(answers) == [1] + [2] * CALLERS, (renders, answers)


def test_an_answer_is_kept_for_keep_seconds_only() -> None:
    clock = [100.0]
    pace: Paced[int] = Paced(keep=1.0, clock=lambda: clock[0])
    count = iter(range(1, 100))
    assert pace.get("m", lambda: next(count)) == 1
    clock[0] += 0.9
    assert pace.get("m", lambda: next(count)) == 1  # within keep: the same render
    assert pace.get("other", lambda: next(count)) == 2  # another format: its own
    clock[0] += 0.2
    assert pace.get("m", lambda: next(count)) == 3  # past keep: rendered again
    unkept: Paced[int] = Paced(clock=lambda: clock[0])
    assert unkept.get("s", lambda: next(count)) == 4
    assert unkept.get("s", lambda: next(count)) == 5  # keep 0: each request its own


def test_answers_are_spaced_to_their_rate() -> None:
    clock = [100.0]
    spaced = Spaced(rate=20, clock=lambda: clock[0])
    slept = [round(spaced.wait(), 3) for _ in range(4)]  # asked at once: each waits its turn
    assert slept == [0.0, 0.05, 0.1, 0.15]
    clock[0] += 1.0
    assert spaced.wait() == 0.0  # none given for a while: at once


def test_metrics_answers_are_what_prometheus_client_renders() -> None:
    registry = CollectorRegistry()
    Gauge("jobd_a", "a", ["queue"], registry=registry).labels("q").set(3)
    Gauge("jobd_b", "b", registry=registry).set(4)
    app = paced_metrics(registry)

    def get(query: str = "", **headers: str) -> tuple[dict[str, str], bytes]:
        said: list[list[tuple[str, str]]] = []
        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": query}
        environ.update({"HTTP_" + k.upper(): v for k, v in headers.items()})
        body = b"".join(app(environ, lambda code, h: said.append(h)))
        return dict(said[0]), body

    headers, body = get()
    assert body == generate_latest(registry) and headers["Content-Type"].startswith("text/plain")
    headers, body = get(accept_encoding="gzip")
    assert headers["Content-Encoding"] == "gzip" and gzip.decompress(body) == generate_latest(
        registry
    )
    _, body = get("name[]=jobd_b")
    assert b"jobd_b 4.0" in body and b"jobd_a" not in body
    headers, body = get(accept="application/openmetrics-text; version=1.0.0")
    assert headers["Content-Type"].startswith("application/openmetrics-text") and b"# EOF" in body


def test_a_failed_render_fails_the_requests_that_waited_for_it_and_the_next_renders_again() -> None:
    asked: set[int] = set()  # the threads that read the clock: each reads it first as it asks

    def clock() -> float:
        asked.add(threading.get_ident())
        return time.monotonic()

    pace: Paced[int] = Paced(clock=clock)
    began, release = threading.Event(), threading.Event()
    renders: list[int] = []

    def failing() -> int:
        renders.append(1)
        began.set()
        assert release.wait(10)
        raise ConnectionError("Redis away")

    seen: list[object] = []

    def ask() -> None:
        try:
            seen.append(pace.get("summary", failing))
        except ConnectionError as exc:
            seen.append(str(exc))

    first = threading.Thread(target=ask)
    first.start()
    assert began.wait(10)
    others = [threading.Thread(target=ask) for _ in range(CALLERS)]
    for t in others:
        t.start()
    wait_until(lambda: len(asked) == CALLERS + 1, what="every request to have asked")
    release.set()
    for t in [first, *others]:
        t.join(10)
    # One render: its error reached everyone who waited for it (review 36m: each rendered again).
    assert renders == [1] and seen == ["Redis away"] * (CALLERS + 1), (renders, seen)
    assert pace.get("summary", lambda: 7) == 7  # the next request renders again


def test_a_selection_is_cut_from_the_whole_render_as_restricted_registry_renders_it() -> None:
    registry = CollectorRegistry()
    Gauge("jobd_a", "a", ["queue"], registry=registry).labels("q").set(3)
    Gauge("jobd_b", "b", registry=registry).set(4)
    Counter("jobd_c", "c", ["queue"], registry=registry)  # no child: a family of no samples
    Counter("jobd_d", "d", registry=registry).inc()
    whole = generate_latest(registry)
    app = paced_metrics(registry)
    for names in (["jobd_b"], ["jobd_a", "x1"], ["jobd_d_total", "jobd_c_total"], ["jobd_d"],
                  ["nothing"], ["jobd_a", "jobd_b", "jobd_d_total", "jobd_d_created"]):  # fmt: skip
        query = "&".join(f"name[]={n}" for n in names)
        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": query}
        body = b"".join(app(environ, lambda code, h: None))
        wanted = generate_latest(registry.restricted_registry(names))
        assert sorted(body.splitlines()) == sorted(wanted.splitlines()), names
        assert all(line in whole.splitlines() for line in body.splitlines())
