"""`jobd notify`'s message (``jobd.cli.notify.message``) is one the daemon takes whole, as it
takes it: its limits are the daemon's (said again in the command, which imports none of the
daemon's modules), a progress is a plain decimal that reads back as the same number, an
extension past 64 bits of µs is the most the key takes, and a message the daemon would cut or
refuse is refused before it is sent (exit 2). Through the real parser (``process.channel``)."""

from __future__ import annotations

import argparse

import pytest

from jobd.cli import notify
from jobd.daemon import receive
from jobd.process import channel


def args(**given: object) -> argparse.Namespace:
    fields = dict(status=None, progress=None, extend=None, watchdog=False, result=None)
    return argparse.Namespace(**{**fields, "fields": [], **given})


def test_its_limits_are_the_daemons() -> None:
    assert notify.MESSAGE_MAX == receive.MESSAGE_MAX
    assert notify.LINES_MAX == channel.LINES_MAX
    assert notify.USEC_MAX == channel.USEC_MAX


@pytest.mark.parametrize(
    "given", ["0", "-0", "100", "42", "12.5", "0.00005", "1e-5", "5e-324", "99.99999999999999"]
)
def test_a_progress_is_sent_as_a_decimal_that_reads_back_the_same(given: str) -> None:
    said = channel.parse(notify.message(args(progress=given)))
    assert said.well and said.progress == abs(float(given))


def test_an_extension_past_64_bits_is_the_most_the_key_takes() -> None:
    for duration in ("999999999d", "99999999999999999999h", "9" * 400 + "d"):
        said = channel.parse(notify.message(args(extend=duration)))
        assert said.well and said.extend == channel.USEC_MAX
    assert channel.parse(notify.message(args(extend="1.5s"))).extend == 1_500_000


def test_a_message_the_daemon_would_cut_or_refuse_is_refused() -> None:
    fits = "x" * (notify.MESSAGE_MAX - len("X_JOBD_RESULT="))
    assert channel.parse(notify.message(args(result=fits))).result == fits.encode()
    with pytest.raises(ValueError, match="JOBD_RESULT"):
        notify.message(args(result=fits + "x"))
    lines = [f"K{i}=v" for i in range(notify.LINES_MAX)]
    assert channel.parse(notify.message(args(fields=lines))).well
    with pytest.raises(ValueError, match="at most"):
        notify.message(args(fields=[*lines, "K=v"]))
