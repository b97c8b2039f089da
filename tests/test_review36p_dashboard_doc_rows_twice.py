"""Review 36p of issue 36: docs/operations/dashboard.md's table of what each read takes has two
rows "each queue's small hashes (...)" and two rows "each queue's consumer group and its
consumers (...)": c9c321d (the running tab's names bound) added its new rows beside the old
ones instead of replacing them. The old "small hashes" row still says a table is read only when
its MEMORY USAGE "is no more than the fields a read takes at their cap (4 MiB at least; the
running records: 1 000 of 16 KiB, 16 MiB ...)", the bound c9c321d replaced (HLEN fields of a
1 KiB name and a cap-byte value), so the page states two contradictory bounds for the same read;
ab1acce then edited one of the two group rows only, so they now differ too.

Reproduced: count the table rows by their first cell.

What should happen: each read has one row, saying what the code does. Suggested fix: delete the
older of each pair (keeping ab1acce's and c9c321d's texts).

Fixed (review 36p): the older row of each pair is deleted; the page keeps c9c321d's small-hashes
row (HLEN fields at jobd's largest) and ab1acce's group row (XLEN, the idle time).
"""

from __future__ import annotations

import pathlib
from collections import Counter

PAGE = pathlib.Path(__file__).parents[1] / "docs" / "operations" / "dashboard.md"


def test_each_read_of_the_dashboard_page_has_one_row() -> None:
    firsts = Counter(
        line.split(" | ")[0]
        for line in PAGE.read_text().splitlines()
        if line.startswith("| ") and not line.startswith("| ---")
    )
    twice = {cell: n for cell, n in firsts.items() if n > 1}
    assert not twice, f"rows said more than once in {PAGE.name}: {twice}"
