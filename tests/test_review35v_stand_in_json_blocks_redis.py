"""Review 35v of issue 35: since aeced24 a stand-in's on_dead_letter JSON is built inside
dead_letter.lua (lib/chains.lua ``held_hook_blocked``/``held_json``), and for a hostile entry
that one script call blocks Redis for seconds: every client (every daemon, every producer)
gets ``BUSY Redis is busy running a script`` meanwhile.

``held_json`` runs ``utf8_text`` over every value of the record, byte by byte in Lua (a table
insert and, for a byte not in valid UTF-8, a ``string.format`` each), and ``held_hook_blocked``
calls ``held_json`` up to 14 times (at CLIP, at 0, then a binary search) when the JSON is above
the hook queue's max_payload. A stand-in's record is copied from the entry: up to MAX_FIELDS
values of CLIP_BYTES (1 KiB) each, i.e. about 1 MB of producer bytes, each of which may be
0xff. Before aeced24 the daemon built the JSON from the stand-in's few fields (the call took
~25 ms here); now it takes ~6-7 s (measured: SLOWLOG 6.29 s and 7.31 s; 1.2 s when the hook
queue keeps its default max_payload, 16MiB: one held_json pass, no search). The held-job path had the same code, but a stand-in is, by
definition, the entry jobd refused to read because it is too large.

Reproduce: queue ``a`` (max_payload 4KiB, on_dead_letter: alerts), ``alerts`` with
max_payload 1MiB; XADD to ``a`` one entry of 998 fields of 2 KiB of 0xff plus a job_id (about
2 MiB: a stand-in, dead-lettered as malformed); start a daemon; read SLOWLOG after the alert.

What should happen: dead-lettering one entry costs Redis milliseconds, not seconds, whatever
bytes the entry holds (well under Redis's busy-reply threshold of 5 s; asserted: < 1 s).

Suggested fix: build a stand-in's JSON in linear time once: e.g. in utf8_text skip runs of
valid UTF-8 with string.find patterns and escape only the bad bytes (or gsub over
'[\\128-\\255]' runs), convert each record value once and compute the JSON size for a given cut
arithmetically (per value, the converted length of each prefix) instead of rebuilding the whole
JSON at every step of the binary search; or bound the bytes the Lua side converts (the record
of a stand-in keeps CLIP_BYTES per value: the JSON could keep less of a stand-in's values)."""

from __future__ import annotations

import time
from collections.abc import Callable

import redis
from support import DaemonProcess, wait_until
from test_review35u_hook_json_stand_in import CONFIG as HOOKED

Daemon = Callable[..., DaemonProcess]

CONFIG = HOOKED + "    max_payload: 1MiB\n"  # the alerts queue's


def test_a_hostile_stand_ins_dead_letter_does_not_block_redis_for_seconds(
    r: redis.Redis, write_config, daemon: Daemon
) -> None:
    path = write_config(CONFIG)
    fields: dict[str, bytes | str] = {f"f{i:03}": b"\xff" * 2048 for i in range(998)}
    fields["job_id"] = "hostile"
    r.xadd("jobd:a", fields)
    r.slowlog_reset()
    daemon(path)

    def alerted() -> bool:
        try:
            return r.xlen("jobd:alerts") == 1
        except redis.exceptions.ResponseError as e:  # BUSY: the script still runs
            assert "BUSY" in str(e), e
            time.sleep(0.5)
            return False

    wait_until(alerted, timeout=120, what="the alert")
    logged = [
        (e["duration"] / 1e6, e["command"][:60])
        for e in r.slowlog_get(128)
        if b"{jobd:a}:dead" in e["command"]
    ]  # the dead_letter.lua call (its keys name the dead-letter stream), when over 10 ms
    slowest = max(logged, default=(0.0, b"not in the slow log: under its 10 ms"))
    assert slowest[0] < 1.0, f"one dead letter held Redis for {slowest[0]:.2f} s: {slowest[1]!r}"
