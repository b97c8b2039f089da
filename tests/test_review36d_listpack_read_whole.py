"""Review 4 of issue 36: a hash kept as a listpack is read whole, whatever its values hold.

``hashes_shown.lua`` reads a hash Redis keeps as a listpack with one HGETALL, "small by Redis's
own bound (hash-max-listpack-entries fields of hash-max-listpack-value bytes)", and
``lib/shown.lua hash_read`` pages a hash with HSCAN, which returns a listpack whole in one page
whatever its COUNT. But a listpack is never converted back, and only its writes check the
bound: a hash written while the bound was higher (an operator's ``CONFIG SET
hash-max-listpack-value``, a config file tuned for memory), or RESTOREd from a DUMP of one
(RESTORE keeps a listpack holding an 8 MiB value: tried on Redis 7.0.15), stays a listpack with
values of any size. Then the pause's ``by`` of 64 MiB, that the doc says is "never read"
(HSTRLEN first), is copied into the script at each summary (the overview's, every 5 s).

One queue; its pause hash {since, by: 64 MiB} written while hash-max-listpack-value was 1 GiB
(set back to 64 at once). Redis's time in scripts for one /api/summary, against the same pause
once converted to a table (a 65th field of 100 bytes: then HSTRLEN and no read).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis
from support import dashboard_server, get_json

BY = 64 << 20


def _script_usec(r: redis.Redis) -> int:
    info = r.info("commandstats")
    return sum(
        int(v.get("usec", 0)) for k, v in info.items() if k in ("cmdstat_evalsha", "cmdstat_eval")
    )


def _summary_usec(r: redis.Redis, port: int) -> int:
    best = None
    for _ in range(3):  # the least of three: the machine is shared
        before = _script_usec(r)
        summary = get_json(port, "/api/summary")
        spent = _script_usec(r) - before
        best = spent if best is None else min(best, spent)
    assert summary["queues"]["q"]["paused"] is not None
    return best or 0


def test_a_listpack_pause_is_read_whole_at_each_summary(
    r: redis.Redis, write_config: Any, tmp_path: Path
) -> None:
    config = write_config("redis: {url: '{redis}'}\nqueues:\n  q: {command: [/bin/true]}\n")
    old = r.config_get("hash-max-listpack-value")["hash-max-listpack-value"]
    r.config_set("hash-max-listpack-value", 1 << 30)
    try:
        r.hset("{jobd:q}:paused", mapping={"since": "1795960000000", "by": b"x" * BY})
    finally:
        r.config_set("hash-max-listpack-value", old)
    assert r.object("encoding", "{jobd:q}:paused") == b"listpack"
    with dashboard_server(config) as port:
        get_json(port, "/api/summary")  # scripts loaded
        listpack = _summary_usec(r, port)
        r.hset("{jobd:q}:paused", "other", "y" * 100)  # now a table: HSTRLEN, no read
        assert r.object("encoding", "{jobd:q}:paused") == b"hashtable"
        table = _summary_usec(r, port)
    # Expected: the 64 MiB value never read either way: about the same time in scripts.
    assert listpack <= 3 * table + 5000, (
        f"one summary: {listpack / 1000:.1f} ms of Redis in scripts with the pause a listpack "
        f"holding {BY >> 20} MiB, {table / 1000:.1f} ms with the same pause as a table"
    )
