"""A daemon stopping ends its readers' waits for new entries at once (``doorbell.Bell.cut``), not
after up to a BLOCK (1 s): the dashboard's daemons list must drop a daemon stopped with SIGTERM
within 2 s (issue 36), and the stop CI of session 22 measured 2.02 s — a reader's last wait plus
the page's one-second poll on a loaded machine. Only a wait is cut: XREAD delivers nothing to a
group, so no entry can be lost with its reply. Real Redis, a real reader thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import redis

from jobd.store import doorbell
from jobd.store.store import Store

LONG_MS = 10_000  # a wait far longer than any stop may take


def _blocked_xread(r: redis.Redis) -> bool:
    """Whether a client of the server waits in XREAD now (CLIENT LIST: flags b)."""
    return any(c["cmd"] == "xread" and "b" in c["flags"] for c in r.client_list())


def _until(predicate: Callable[[], object], what: str, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_a_wait_cut_ends_at_once_and_no_later_wait_is_sent(r: redis.Redis) -> None:
    r.xadd("s", {"payload": "x"})
    store = Store(redis.Redis(port=r.connection_pool.connection_kwargs["port"]))
    newest = {"s": r.xrevrange("s", count=1)[0][0].decode()}
    failed: list[BaseException] = []

    def wait() -> None:
        try:
            store.wait_for_entries(newest, LONG_MS)
        except BaseException as exc:
            failed.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    _until(lambda: _blocked_xread(r), "the wait blocked in Redis")
    began = time.monotonic()
    store.bell.cut()
    waiter.join(LONG_MS / 1000)
    took = time.monotonic() - began
    assert not waiter.is_alive() and took < 1.0, f"the cut wait ended {took:.2f} s later"
    assert failed and isinstance(failed[0], redis.ConnectionError), failed
    _until(lambda: not _blocked_xread(r), "Redis to let the cut client go")
    with pytest.raises(redis.ConnectionError, match="cut"):  # once cut, nothing more is sent
        store.wait_for_entries(newest, LONG_MS)
    assert not _blocked_xread(r)
    store.close()


def test_a_bell_never_cuts_what_is_not_a_wait() -> None:
    bell = doorbell.Bell()
    bell.cut()  # no wait under way: nothing to shut, and no error
    assert bell.waiting is None and bell.was_cut
