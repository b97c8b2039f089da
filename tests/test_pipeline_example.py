"""The example pipeline of docs/workflows.md, as shipped in config/pipeline.yaml and
handlers/pipeline/: fetch → transform → fan-out → aggregate, and its failure hook, end to end
through a real daemon on a Redis of its own (the config's embedded one, in the test's folder)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli, wait_until

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = ROOT / "config" / "pipeline.yaml"

DOCUMENT = """\
The quick brown fox jumps over the lazy dog.

The dog sleeps. The fox runs
far away, and the dog's friend waits.

42 -- nothing here but a number? No: words again.
"""


def test_the_example_pipeline_counts_a_document_and_tells_a_failure(
    daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    out, state = tmp_path / "out", tmp_path / "redis-state"
    env = {"PIPELINE_OUT": str(out), "STATE_DIRECTORY": str(state)}
    document = tmp_path / "fox.txt"
    document.write_text(DOCUMENT)
    daemon(PIPELINE, env=env)
    for payload, job_id in ((str(document), "fox"), (str(tmp_path / "nowhere.txt"), "lost")):
        sent = jobd_cli("enqueue", "-c", str(PIPELINE), "fetch", payload, "--job-id", job_id,
                        env=env)  # fmt: skip
        assert sent.returncode == 0, sent.stderr
    report = out / "fox" / "report.json"
    wait_until(report.exists, what="the report")
    got = json.loads(report.read_text())
    assert (got["doc"], got["paragraphs"], got["words"], got["distinct"]) == ("fox", 3, 30, 24)
    assert got["top"][:3] == [["the", 5], ["dog", 2], ["fox", 2]]
    wait_until((out / "alerts.log").exists, what="the alert")
    (line,) = (out / "alerts.log").read_text().splitlines()
    assert line.startswith("fetch job lost dead-lettered (exit): ")
    assert "No such file or directory" in line
    # Each step ran once, and was enqueued by the one before.
    r = redis.Redis(unix_socket_path=str(state / "redis.sock"))
    try:
        ids = {q: [f.get(b"job_id", f.get(b"jobd_job_id")) for _, f in r.xrange(f"jobd:{q}")]
               for q in ("transform", "count", "aggregate", "alerts")}  # fmt: skip
    finally:
        r.close()
    assert ids["transform"] == [b"fox.then.1"]
    assert ids["count"] == [b"fox.then.1.1", b"fox.then.1.2", b"fox.then.1.3"]
    assert sorted(ids["aggregate"]) == [b"fox.then.1.%d.then.1" % n for n in (1, 2, 3)]
    assert ids["alerts"] == [b"lost.dead"]
