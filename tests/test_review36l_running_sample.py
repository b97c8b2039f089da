"""Review 36l of issue 36: the running tab's search by job id finds a running job at one read
and not at the next: each read of the active hash is a new random sample (HRANDFIELD).

Round 36k (f6d5d3f) made ``lib/shown.lua hash_read`` take the names first with HRANDFIELD and a
positive count: the whole hash (in its own order) when it holds ``most`` (RUNNING_READ, 1 000)
or fewer, else ``most`` names at random, a sample that differs from one read to the next (Redis:
past 3 x count, each name picked at random). So once more than 1 000 records are in a queue's
active hash (3 000 jobs running: 50 daemons of 64 slots each; stale records count too), each
read keeps a different 1 000 of them (here a search found the job at 12 reads of 20).
``pages._running`` searches and pages within one read: a search for a job that runs finds it at
one refresh and not at the next ("no such running job": did it end?), page 2 (its cursor taken
from page 1's sample) continues in another sample, skipping jobs page 1's sample held, and a
bulk cancel's selection vanishes from view between two refreshes. Before 36k, HSCAN from cursor
0 read the same part of the hash at each read (bounded, but stable). (Between 1 000 and 3 000
records Redis copies the hash and drops names at random: with 1 500 records of a 1 000-byte
status, the budget's cut moved, and a search missed 2 reads of 20.)

What should happen: a search by job id finds a running job whatever else runs (one HGET of the
active hash by that id, as a job lookup does), and the tab reads the same records from one read
to the next (for instance the names sorted before the budget is spent).
"""

from __future__ import annotations

import json

import redis
from test_dashboard_pages import App, app  # noqa: F401  (the fixture)

RUNNING = 3000  # 3 x RUNNING_READ: Redis picks each of the 1 000 names at random
READS = 20


def test_a_search_finds_a_running_job_at_every_read(r: redis.Redis, app: App) -> None:  # noqa: F811
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    pipe = r.pipeline()
    for i in range(RUNNING):
        pipe.xadd("jobd:q", {"payload": "p", "job_id": f"job-{i:04}"})
    entries = [e.decode() for e in pipe.execute()]
    r.xreadgroup("jobd", "host-1-abcd", {"jobd:q": ">"}, count=RUNNING)  # held: running
    pipe = r.pipeline()
    for i, entry in enumerate(entries):
        record = {
            "consumer": "host-1-abcd",
            "host": "host",
            "pid": 1000 + i,
            "since": 1,
            "attempt": 1,
        }
        raw = f"jobd:q|{entry}\n".encode() + json.dumps(record).encode()
        pipe.hset("{jobd:q}:active", f"job-{i:04}", raw)
    pipe.execute()
    sought = "job-0500"
    found = [
        [j["job_id"] for j in app.get("/api/jobs", queue="q", state="running", find=sought)["jobs"]]
        for _ in range(READS)
    ]
    hits = sum(ids == [sought] for ids in found)
    assert hits == READS, (
        f"{RUNNING} jobs run; a search for {sought} "
        f"(running all along) found it at {hits} of {READS} reads: {found}"
    )
