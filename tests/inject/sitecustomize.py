"""Test-only: a descheduled recorder, a slow renewal. With ``JOBD_TEST_SETTLE_DELAY=SECONDS`` in the environment,
the recorder thread sleeps that long after a settle round trip whose batch holds a hand-back, as
a thread starved of the CPU or the GIL would (``tests/test_prefetch_review.py``). Python imports
this module at start-up from ``PYTHONPATH``, which the test sets for the daemon it starts."""

from __future__ import annotations

import os
import time

DELAY = float(os.environ.get("JOBD_TEST_SETTLE_DELAY", "0"))

if DELAY:
    from jobd.outcome import Verb
    from jobd.store import outcomes

    settle = outcomes.OutcomeOps.settle

    def slow_settle(self, batch):  # type: ignore[no-untyped-def]
        result = settle(self, batch)
        if any(o.verb is Verb.HAND_BACK for o in batch):
            time.sleep(DELAY)
        return result

    outcomes.OutcomeOps.settle = slow_settle  # type: ignore[method-assign]

# ``JOBD_TEST_RENEW_SLOW=SECONDS``: each lease renewal's call takes that long before it is sent,
# and one that reports a loss is handed on that much later again (a slow round trip, a
# descheduled ticker).
SLOW = float(os.environ.get("JOBD_TEST_RENEW_SLOW", "0"))

if SLOW:
    from jobd.store.store import Store

    renew = Store.renew

    def slow_renew(self, queue, ids):  # type: ignore[no-untyped-def]
        time.sleep(SLOW)
        lost = renew(self, queue, ids)
        if lost:
            time.sleep(SLOW)
        return lost

    Store.renew = slow_renew  # type: ignore[method-assign]
