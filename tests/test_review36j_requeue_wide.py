"""Review 36j of issue 36: a requeue of every dead letter (``jobd dlq requeue --all``, the
dashboard's "Requeue all") copies any number of fields in one script call when they are empty:
its byte bound counts a field as its bytes alone.

``lua/requeue.lua`` stops a call once the records it visited hold ``REQUEUE_BYTES`` (64 MiB),
"each call holds Redis while it copies them, whatever their size", counting each field as
``#name + #value``. Reading a record costs Redis per field too (each a reply element copied
into a Lua string; here each field is then compared and copied again by ``entry_of``), which
is why every other bounded read in jobd counts a field ``browse.FIELD_COST`` (64) bytes more
(``lua/lib/shown.lua``; browse.py: "an entry of 100 000 empty fields holds a few bytes, costs
as 6 MiB"). A record of 100 000 empty fields (anyone may XADD to the dead-letter stream: the
requeue leaves such a record in place, "more than MAX_FIELDS fields") counts 0 bytes, so one
call visits REQUEUE_CHUNK (500) of them, 50 million fields: here the 60 records below took one
call of 2.5 s, so 500 hold Redis about 20 s, past its 5 s script limit and the clients' 10 s
socket timeout (every daemon takes Redis for away; the slow log's longest call is printed); and as such records stay in place,
every later "requeue all" copies them again. Review 36i bounded the dead-letter search the same
way (review 36j: ``test_review36j_dead_letter_find_wide.py``).

What should happen: a call counts each field it visits as the dashboard's reads do (its bytes
plus FIELD_COST), so a call copies at most about REQUEUE_BYTES' worth and the requeue goes on
in further calls; counted, not timed (a loaded machine slows every call alike).
"""

from __future__ import annotations

from typing import Any

import redis
from support import counted_scripts, jobd_cli, queue_config

from jobd import config as jobd_config
from jobd.store.admin import REQUEUE_BYTES
from jobd.store.browse import FIELD_COST

RECORDS = 24  # at least 2 calls with the bound (11 records a call), 1 without it
WIDTH = 100_000  # empty fields (name and value) of each record


def test_requeueing_every_dead_letter_counts_each_field_it_copies(
    r: redis.Redis, write_config: Any
) -> None:
    config = write_config(queue_config("[/bin/true]"))
    q = jobd_config.load(str(config)).queues["q"]
    for _ in range(RECORDS):
        r.execute_command("XADD", q.dead_letter.stream, "*", *([b"", b""] * WIDTH))
    calls, done = counted_scripts(
        r, lambda: jobd_cli("dlq", "-c", str(config), "q", "requeue", "--all")
    )
    assert done.returncode in (0, 1), done.stderr  # 1: records left in place (not jobs)
    # A call stops once what it visited costs REQUEUE_BYTES (one record past it at most), each
    # record costing WIDTH * FIELD_COST as every other bounded read counts these fields.
    per_call = REQUEUE_BYTES // (WIDTH * FIELD_COST) + 1
    assert calls >= RECORDS // per_call, (
        f"{calls} requeue.lua call(s) visited {RECORDS} records of {WIDTH} empty fields (each "
        f"{WIDTH * FIELD_COST >> 20} MiB as FIELD_COST counts a field): an empty field counts "
        f"nothing against REQUEUE_BYTES ({REQUEUE_BYTES >> 20} MiB), 500 such records a call"
    )
