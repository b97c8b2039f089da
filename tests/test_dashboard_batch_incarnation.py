"""Review 35s: the dashboard shows a job the progress of a batch it was never a member of.

`jobd job` tells a record of an earlier batch of the id (cli/workflow.py batch_now,
batch_where: `(an earlier batch of this id: …)`) by the record's ``batch_incarnation``. The
dashboard's job page does not: dashboard.js linksList reads /api/batch?id=<api/job's batch>
and shows its counts as the job's batch's progress, and neither /api/job (web/dashboard.py
job_lookup: ``view_links``, the batch id alone) nor /api/batch (web/pages.py batch_page:
``counts()``, no incarnation) says which batch of the id it is. So the page of a job done in
an earlier batch B shows the progress of the batch B made since (docs/workflows.md: "for a
member, its batch's progress"), with no way to tell.

Fixed: /api/job gives ``batch_incarnation`` (and each record its own) and ``batch_left`` (its
latest record naming the batch is its requeue), /api/batch the batch's ``incarnation``; the
page shows "an earlier batch of this id" (no progress) when they differ, and a batch left as
left.
"""

from __future__ import annotations

import json

import redis
from support import free_port, wait_until
from test_after_batches import CALLBACK, RUNS, Daemon, cli, events, queues_yaml, records
from test_dashboard import http

from jobd.config import load
from jobd.store.store import Store


def test_the_api_tells_the_page_which_batch_of_the_id_a_job_was_a_member_of(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    port = free_port()
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + f"metrics: {{listen: '127.0.0.1:{port}'}}\n"
                       + queues_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    daemon(cfg)
    # a member of an earlier batch B (its incarnation 5: that batch is gone) ...
    r.xadd("jobd:a", {"payload": "x", "job_id": "old", "jobd_batch": "B",
                      "jobd_batch_incarnation": "5"})  # fmt: skip
    wait_until(lambda: "done" in events(records(r, "jobd:a", "old")), what="old done")
    # ... and the batch B made since, of one job held for ever
    cli(cfg, "enqueue", "a", "y", "--job-id", "new", "--after", "never", "--batch", "B")
    assert "an earlier batch of this id" in cli(cfg, "job", "a", "old")
    url = f"http://127.0.0.1:{port}"
    api = json.loads(http(url + "/api/job?queue=a&id=old")[2])
    assert api["batch"] == "B"
    progress = json.loads(http(url + "/api/batch?id=B")[2])
    assert progress["found"] and progress["total"] == 1  # the later batch's counts
    # what the page needs to tell them apart, as `jobd job` does: which batch of the id each is
    assert (api["batch_incarnation"], api["batch_left"]) == ("5", False), api
    assert progress["incarnation"] not in (None, "5"), progress
    assert api["records"][-1]["batch_incarnation"] == "5", api["records"]
    js = http(url + "/static/dashboard.js")[2].decode()
    assert "an earlier batch of this id" in js and "incarnation !== b.incarnation" in js


def test_the_api_tells_a_requeued_job_left_its_batch(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    """A requeue leaves the batch (its new entry carries no jobd_batch): the page says so, not
    that batch's progress as the job's own (its dead letter keeps its batch, and its
    ``requeued`` record names the batch it left)."""
    port = free_port()
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + f"metrics: {{listen: '127.0.0.1:{port}'}}\n"
                       + queues_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    daemon(cfg)
    cli(cfg, "enqueue", "a", "fail", "--job-id", "rq", "--batch", "R")
    q = load(str(cfg)).queues["a"]
    wait_until(lambda: r.xlen(q.dead_letter.stream) == 1, what="rq dead-lettered")
    dead = r.xrange(q.dead_letter.stream)[0][0].decode()
    assert Store(r).requeue(q, [dead], "me@here").moved == [dead]
    wait_until(lambda: "requeued" in events(records(r, "jobd:a", "rq")), what="rq requeued")
    api = json.loads(http(f"http://127.0.0.1:{port}/api/job?queue=a&id=rq")[2])
    assert (api["batch"], api["batch_left"]) == ("R", True), api["records"]
