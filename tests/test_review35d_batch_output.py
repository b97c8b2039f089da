"""Review of issue 35 (workflows), round 5 (review35d): `jobd batch` prints Redis-held text raw.
jobd's rule (jobd/logs.py printable, jobd/cli/history.py): "Everything printed of Redis's bytes
goes through printable", so that what others wrote into Redis "cannot forge a log line or drive
a terminal". `jobd job` escapes a record's `batch`; `jobd batch` prints the batch hash's
`on_complete` (and `state`) as they are (jobd/cli/workflow.py run_batch): anyone who can write
that hash (any producer's credentials: the batch is a key of its own) makes an operator's
`jobd batch` clear the terminal, set its title, or print a forged line. Real Redis, the CLI."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli
from test_after_batches import CALLBACK, RUNS, batch_yaml

from jobd.store.keys import batch

Daemon = Callable[..., DaemonProcess]


def test_jobd_batch_escapes_what_redis_holds(
    r: redis.Redis, write_config, script, tmp_path: Path
) -> None:
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    c = str(cfg)
    out = jobd_cli("enqueue", "-c", c, "a", "x", "--batch", "B", "--on-complete", "cb")
    assert out.returncode == 0, out.stderr
    assert r.hget(batch("B"), "on_complete") == b"cb"
    r.hset(batch("B"), "on_complete", "cb\x1b]0;pwned\x07\x1b[2J\nbatch B: complete, 1 of 1 ended")
    shown = jobd_cli("batch", "-c", c, "B")
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout.decode()
    assert "\x1b" not in text and "\x07" not in text, repr(text)
    assert len(text.splitlines()) == 2, repr(text)  # the summary, and "on complete: …"


def test_jobd_batch_of_a_hash_jobd_never_wrote_says_so_without_a_traceback(
    r: redis.Redis, write_config, script, tmp_path: Path
) -> None:
    """A batch hash whose bytes are not UTF-8 (anyone who can write the key): `jobd batch`
    says there is no batch of jobd's, exit 3, no traceback (before: a UnicodeDecodeError
    traceback; a daemon moving a notice of that batch failed on it at each move)."""
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    c = str(cfg)
    for field, value in (("on_complete", b"\xff\xfe"), ("state", b"open\xff")):
        out = jobd_cli("enqueue", "-c", c, "a", "x", "--batch", "B", "--on-complete", "cb")
        assert out.returncode == 0, out.stderr
        r.hset(batch("B"), field, value)
        shown = jobd_cli("batch", "-c", c, "B")
        assert shown.returncode == 3 and b"Traceback" not in shown.stderr, shown.stderr
        assert b"never wrote" in shown.stderr, shown.stderr
        r.delete(batch("B"))
