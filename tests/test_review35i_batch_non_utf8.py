"""Review of issue 35 (workflows), round 35i: a batch id that is not UTF-8.

What is wrong: jobd takes any bytes from the command line (surrogateescape: `jobd enqueue
--job-id $'\\xff'` works), and jobd.workflows.check_batch_id's pattern takes a lone surrogate
as "a character", so `--batch $'\\xff'` passes the check. The first ``.encode()`` of it then
raises: `jobd enqueue … --batch $'\\xff'` dies with Python's own words as its usage error
("'utf-8' codec can't encode character '\\udcff' … surrogates not allowed"), and `jobd batch
-c CONFIG $'\\xff'` (nothing refuses its id) dies with a traceback (UnicodeEncodeError from
redis-py encoding the key).

What should happen: a batch id that is not UTF-8 is refused by check_batch_id with its own
message (exit 2, as the other rules of a batch id: "1 to 200 characters, no space, …"), and
`jobd batch` of such an id either says there is no such batch (exit 3) or refuses it (exit 2);
never a traceback.

Why it matters: the CLI promises one-line errors for hostile input (every other id is
checked, escaped and refused cleanly: --after's job ids in review 35c); scripts that pass
file names as batch ids hit this."""

from __future__ import annotations

import os

import redis
from support import jobd_cli

CONFIG = "redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n"
BAD = os.fsdecode(b"nightly-\xff")


def test_enqueue_with_a_non_utf8_batch_id_is_refused_by_the_batch_id_check(
    r: redis.Redis, write_config
) -> None:
    c = str(write_config(CONFIG))
    out = jobd_cli("enqueue", "-c", c, "a", "p", "--batch", BAD)
    err = out.stderr.decode(errors="replace")
    assert b"Traceback" not in out.stderr, err[-600:]
    assert out.returncode == 2, err
    assert "batch" in err and "codec" not in err, (
        f"refused with Python's codec message, not the batch id's rule: {err!r}"
    )
    assert not r.keys("{jobd:batch:*"), "nothing written"


def test_jobd_batch_of_a_non_utf8_id_never_fails_with_a_traceback(
    r: redis.Redis, write_config
) -> None:
    c = str(write_config(CONFIG))
    out = jobd_cli("batch", "-c", c, BAD)
    err = out.stderr.decode(errors="replace")
    assert b"Traceback" not in out.stderr, err[-600:]
    assert out.returncode in (2, 3), err
