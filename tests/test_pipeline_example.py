"""The example pipeline of docs/workflows.md, as shipped in config/pipeline.yaml and
handlers/pipeline/: fetch → transform → fan-out → aggregate, and its failure hook, end to end
through a real daemon on a Redis of its own (the config's embedded one, in the test's folder).

The page's commands are read from the page ("An example pipeline") and run as written, from
the repository's root (only the output folder, /tmp/jobd-pipeline, is the test's own through
PIPELINE_OUT): the page and the pipeline cannot part (review 35aa: the page's `fetch README.md`
dead-lettered, the handlers running in config/)."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from support import DaemonProcess, jobd_cli, wait_until

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "workflows.md"
OUT = "/tmp/jobd-pipeline"  # the pipeline's output folder when PIPELINE_OUT is not set

DOCUMENT = """\
The quick brown fox jumps over the lazy dog.

The dog sleeps. The fox runs
far away, and the dog's friend waits.

42 -- nothing here but a number? No: words again.
"""


def page_blocks() -> list[list[str]]:
    """The lines of each `sh` block of the page's section "An example pipeline"."""
    text = PAGE.read_text()
    start = text.index("\n## An example pipeline\n")
    section = text[start : text.index("\n## ", start + 1)]
    return [b.splitlines() for b in re.findall(r"```sh\n(.*?)```", section, re.S)]


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_the_example_pipeline_runs_as_the_page_writes_it(
    daemon: Callable[..., DaemonProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (run, send_readme, cat_report), (send_lost, cat_alerts, alert_shown) = page_blocks()
    assert run == "jobd run config/pipeline.yaml &"
    assert cat_report.startswith(f"cat {OUT}/") and cat_alerts == f"cat {OUT}/alerts.log"
    out, state = tmp_path / "out", tmp_path / "redis-state"
    env = {"PIPELINE_OUT": str(out), "STATE_DIRECTORY": str(state)}
    document = tmp_path / "fox.txt"
    document.write_text(DOCUMENT)
    monkeypatch.chdir(ROOT)  # where the page's commands are run
    daemon(Path(run.split()[2]), env=env)
    for line in (send_readme, send_lost):
        sent = jobd_cli(*shlex.split(line)[1:], env=env)
        assert sent.returncode == 0, (line, sent.stderr)
    sent = jobd_cli("enqueue", "-c", "config/pipeline.yaml", "fetch", str(document), "--job-id",
                    "fox", env=env)  # fmt: skip
    assert sent.returncode == 0, sent.stderr
    report, alerts = Path(cat_report.split()[1].replace(OUT, str(out))), out / "alerts.log"
    wait_until(lambda: report.exists() or " readme " in _read(alerts), what="the report")
    assert " readme " not in _read(alerts), _read(alerts)
    readme = json.loads(report.read_text())
    assert readme["doc"] == "readme" and readme["words"] > 0, readme
    fox = out / "fox" / "report.json"
    wait_until(fox.exists, what="fox's report")
    got = json.loads(fox.read_text())
    assert (got["doc"], got["paragraphs"], got["words"], got["distinct"]) == ("fox", 3, 30, 24)
    assert got["top"][:3] == [["the", 5], ["dog", 2], ["fox", 2]]
    wait_until(alerts.exists, what="the alert")
    (line,) = alerts.read_text().splitlines()  # the README's run alerted nothing
    assert line.startswith(alert_shown.removeprefix("# ").split(" show ")[0] + " show "), line
    # How many parts the README made, as the page says to read it.
    n = readme["paragraphs"]
    shown = jobd_cli("job", "-c", "config/pipeline.yaml", "transform", "readme.then.1", env=env)
    said = shown.stdout.decode()
    assert f"readme: {n} paragraph(s) to count" in said and f"follow-ups: {n}" in said, said
    # Each step ran once, and was enqueued by the one before.
    r = redis.Redis(unix_socket_path=str(state / "redis.sock"))
    try:
        ids = {q: [f.get(b"job_id", f.get(b"jobd_job_id")) for _, f in r.xrange(f"jobd:{q}")]
               for q in ("transform", "count", "aggregate", "alerts")}  # fmt: skip
    finally:
        r.close()
    assert sorted(ids["transform"]) == [b"fox.then.1", b"readme.then.1"]
    assert [i for i in ids["count"] if i.startswith(b"fox.")] == [
        b"fox.then.1.1", b"fox.then.1.2", b"fox.then.1.3"]  # fmt: skip
    parts = sorted(i for i in ids["count"] if i.startswith(b"readme."))
    assert parts == sorted(b"readme.then.1.%d" % k for k in range(1, n + 1))
    assert sorted(ids["aggregate"]) == sorted(b"%s.then.1" % i for i in ids["count"])
    assert ids["alerts"] == [b"lost.dead"]
