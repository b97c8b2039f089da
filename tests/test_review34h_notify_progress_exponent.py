"""Review 34h: ``jobd notify --progress N`` formats its percentage with ``f"{value:g}"``, which
writes any value under 0.0001 in exponent form ("--progress 0.00005" sends
``X_JOBD_PROGRESS=5e-05``); the daemon takes an integer or a decimal only
(``process.channel.percent``: "1e2" is not what the key takes), so it counts the message as
malformed and leaves the progress unset, while `jobd notify`, which accepted the value (it is
within 0 to 100), exits 0. A job that reports a fine-grained start ("0.00005" of a
billion-row import) shows no progress, and nothing tells its handler why.

What should happen: what `jobd notify` accepts it sends in the form the daemon takes (a
plain decimal), or it refuses it (exit 2).

`jobd notify` as a handler runs it, against a datagram socket of the test's standing in for the
daemon's channel (it reads the message and closes the descriptor sent with it, as the daemon
does), the message parsed as the daemon parses it."""

from __future__ import annotations

import os

import pytest
from test_review34h_notify_extend_overflow import notify_once

from jobd.process.channel import parse


@pytest.mark.parametrize("progress", ["0.00005", "0.00001"])
def test_a_progress_jobd_notify_accepts_is_one_the_daemon_takes(progress: str) -> None:
    name = f"jobd-test/{os.getpid()}/progress/{progress}"
    code, data, _ = notify_once(["--progress", progress], name)
    if code == 2:
        assert data is None, "refused, yet sent"
        return
    assert data is not None, f"exit {code}, nothing sent"
    said = parse(data)
    assert said.well and said.progress == float(progress), (
        f"`jobd notify --progress {progress}` exited {code} (read), but sent {data!r}: the "
        "daemon finds it malformed and sets no progress"
    )
