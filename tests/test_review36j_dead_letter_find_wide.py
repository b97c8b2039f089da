"""Review 36j of issue 36: looking for a job id's dead letter copies any number of fields in
one script call when they are empty: the byte bound of review 36i counts a field as its bytes
alone.

Review 36i bounded a call of ``lua/dead_letter_find.lua`` (``jobd dlq show JOB_ID``, ``jobd dlq
requeue JOB_ID``) by the bytes of the records it visited (``FIND_BYTES``, 8 MiB), counting each
field as ``#name + #value``. Reading a record costs Redis per field too (each one a reply
element copied into a Lua string), which is why every other bounded read in jobd counts a field
``browse.FIELD_COST`` (64) bytes more (``lua/lib/shown.lua``'s ``field_cost``; browse.py: "an
entry of 100 000 empty fields holds a few bytes, costs as 6 MiB"). Anyone who may XADD to the
dead-letter stream (jobd's docs: "others may XADD to the stream too") can add records of
100 000 empty fields: each counts 0 bytes here, so one call visits FIND_CHUNK (500) of them, 50
million fields, holding Redis for the whole copy: here the 20 records below took one call of
0.29 s (the slow log's longest call is printed), so 500 hold Redis about 7 s, past its 5 s
script limit, while every daemon's renewals and reads wait (and past the clients' 10 s socket
timeout every daemon takes Redis for away). The operator's lookup of one job id during an incident is what
runs it.

What should happen: a call counts each field it visits as the dashboard's reads do (its bytes
plus FIELD_COST), so a call copies at most about FIND_BYTES' worth of fields and the search goes
on in further calls; counted, not timed (a loaded machine slows every call alike).
"""

from __future__ import annotations

from typing import Any

import redis
from support import counted_scripts, jobd_cli, queue_config

from jobd import config as jobd_config
from jobd.store.admin import FIND_BYTES
from jobd.store.browse import FIELD_COST

RECORDS = 20
WIDTH = 100_000  # empty fields (name and value) of each record


def test_looking_for_a_job_ids_dead_letter_counts_each_field_it_copies(
    r: redis.Redis, write_config: Any
) -> None:
    config = write_config(queue_config("[/bin/true]"))
    q = jobd_config.load(str(config)).queues["q"]
    r.xadd(q.dead_letter.stream, {"jobd_job_id": "job-0", "jobd_error": "exit", "payload": "x"})
    for _ in range(RECORDS):  # newer than job-0's: the search walks them all first
        r.execute_command("XADD", q.dead_letter.stream, "*", *([b"", b""] * WIDTH))
    calls, shown = counted_scripts(
        r, lambda: jobd_cli("dlq", "-c", str(config), "q", "show", "job-0")
    )
    assert shown.returncode == 0, shown.stderr
    # A call stops once what it visited costs FIND_BYTES (one record past it at most), each
    # record costing WIDTH * FIELD_COST as every other bounded read counts these fields.
    per_call = FIND_BYTES // (WIDTH * FIELD_COST) + 1
    assert calls >= RECORDS // per_call, (
        f"{calls} dead_letter_find.lua call(s) visited {RECORDS} records of {WIDTH} empty fields "
        f"(each {WIDTH * FIELD_COST >> 20} MiB as FIELD_COST counts a field): an empty field "
        f"counts nothing against FIND_BYTES ({FIND_BYTES >> 20} MiB), 500 such records a call"
    )
