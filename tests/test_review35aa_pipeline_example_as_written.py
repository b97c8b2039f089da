"""medium: the Workflows page's example pipeline fails when run as written: `jobd enqueue -c
config/pipeline.yaml fetch README.md --job-id readme` dead-letters its fetch ("README.md: No such
file or directory") and no report is ever written.

What is wrong: docs/workflows.md, "An example pipeline", runs

    jobd run config/pipeline.yaml &
    jobd enqueue -c config/pipeline.yaml fetch README.md --job-id readme
    cat /tmp/jobd-pipeline/readme/report.json

and says fetch reads "the document its payload names (a path, relative to `config/`, …)". The
handlers run in the config file's folder (no `cwd:` in config/pipeline.yaml), and there is no
config/README.md: the repository's README.md is one folder up. So fetch exits 65, the job is
dead-lettered at once, alerts.log gets `fetch job readme dead-lettered (exit): README.md: No
such file or directory …`, and `cat …/readme/report.json` fails. tests/test_pipeline_example.py
passes only because it enqueues an absolute path of a document of its own, not the command the
page shows. (The page's "the 9 `count` jobs (`readme.then.1.1` … `.9`)" does not match the
repository's README either: `../README.md` gives 25 paragraphs today.)

Reproduce: this test runs the page's commands with the shipped config, a daemon on the config's
embedded Redis (state and output in the test's folder), and waits for the report or the alert.

What should happen: the page's example runs as written and writes readme/report.json. Why it
matters: it is the first thing a reader of the Workflows page runs, and it shows the failure
hook instead of the pipeline.

Suggested fix: write the command with `../README.md` (and drop or soften the "9" count), or
give config/pipeline.yaml's fetch queue `cwd: ..` (then say "relative to the repository"), and
make tests/test_pipeline_example.py enqueue exactly the page's command, so the two cannot part
again.

Fixed (review 35aa): config/pipeline.yaml's fetch queue runs in the repository's root (`cwd:
..`), so `fetch README.md` reads the repository's README, and the page says "relative to the
repository's root"; the page no longer states how many paragraphs the README makes, but how to
read it (transform's output, its `follow-ups: N`). tests/test_pipeline_example.py now reads the
section's commands from the page and runs them as written, from the repository's root.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from support import DaemonProcess, jobd_cli, wait_until

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = ROOT / "config" / "pipeline.yaml"


def test_the_pages_pipeline_command_writes_the_report(
    daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    out, state = tmp_path / "out", tmp_path / "redis-state"
    env = {"PIPELINE_OUT": str(out), "STATE_DIRECTORY": str(state)}
    daemon(PIPELINE, env=env)
    # The page's command, word for word (only the config's path made absolute).
    sent = jobd_cli("enqueue", "-c", str(PIPELINE), "fetch", "README.md", "--job-id", "readme",
                    env=env)  # fmt: skip
    assert sent.returncode == 0, sent.stderr
    report, alerts = out / "readme" / "report.json", out / "alerts.log"
    wait_until(lambda: report.exists() or alerts.exists(), what="the report or an alert")
    assert not alerts.exists(), alerts.read_text()
    got = json.loads(report.read_text())
    assert got["doc"] == "readme" and got["words"] > 0
