"""The operator's kit (deploy/): every metric the Grafana dashboard or the alert rules name is
one a running jobd serves; and what /metrics says of jobd itself (its build) and leaves out
(the ``*_created`` series)."""

from __future__ import annotations

import json
import platform
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
import yaml
from support import DaemonProcess, free_port, jobd_cli, pending_count, wait_until

from jobd import __version__

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "jobd.json"
ALERTS = ROOT / "deploy" / "prometheus" / "jobd-alerts.yml"
# Served only by a supervisor (processes over 1): its restarts of its daemon processes.
SUPERVISOR_ONLY = {"jobd_process_restarts_total"}
# Names a PromQL expression of the kit may use that are no series of jobd's: Prometheus's own.
NOT_JOBDS = {"up"}
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


def expressions() -> list[str]:
    """Every PromQL expression of the dashboard (panels and variables) and the rules."""
    found = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        found += [target["expr"] for target in panel.get("targets", [])]
    for variable in json.loads(DASHBOARD.read_text())["templating"]["list"]:
        if variable["type"] == "query":
            found.append(variable["query"]["query"])
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        found += [rule["expr"] for rule in group["rules"]]
    return found


def named(expression: str) -> set[str]:
    """The metric names an expression uses: jobd's, prometheus_client's process_*, `up`."""
    return set(re.findall(r"\b(jobd_[a-z0-9_]+|process_[a-z0-9_]+|up)\b(?!\s*[=!~])", expression))


def served(text: str) -> set[str]:
    """Every series name /metrics declares (a `# TYPE` line, with a histogram's suffixes)
    or has a sample of."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            names |= {name} | {name + s for s in SUFFIXES.get(kind, ())}
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def run_jobs(r: redis.Redis, config: Path) -> None:
    """One job that succeeds and one dead-lettered, so the labelled series exist."""
    for payload in ("ok", "bad"):
        assert jobd_cli("enqueue", "-c", str(config), "q", payload).returncode == 0
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 1 and pending_count(r, "jobd:q") == 0)


@pytest.mark.parametrize("processes", [1, 2])
def test_every_metric_the_kit_names_is_served_and_no_created_series(
    r: redis.Redis,
    write_config: Callable[..., Path],
    script: Callable[[str, str], Path],
    daemon: Callable[..., DaemonProcess],
    processes: int,
) -> None:
    script("h.sh", '#!/bin/sh\n[ "$(cat)" = ok ]\n')
    port = free_port()
    config = write_config(
        f"redis: {{url: '{{redis}}'}}\nprocesses: {processes}\n"
        f"metrics: {{listen: '127.0.0.1:{port}'}}\n"
        "queues:\n  q: {command: [./h.sh], retry: {max_attempts: 1}}\n"
    )
    d = daemon(config, ready=processes == 1)
    if processes > 1:
        d.wait_log(f"jobd.supervisor: ready: {processes} daemon processes")
    run_jobs(r, config)
    # The queue gauges and jobd_redis_up come from the status report, every 5 s.
    wait_until(lambda: 'jobd_queue_dead_lettered{queue="q"} 1.0' in scrape(port), 20)
    text = scrape(port)
    build = f'jobd_build_info{{python="{platform.python_version()}",version="{__version__}"}} 1.0'
    assert build in text.splitlines()
    assert "jobd_redis_up 1.0" in text.splitlines()
    assert 'jobd_jobs_failed_total{error="exit",queue="q"} 1.0' in text.splitlines()
    assert "_created" not in text
    wanted = set().union(*map(named, expressions())) - NOT_JOBDS
    assert len(wanted) >= 20, wanted  # the expressions were read
    if processes == 1:
        wanted -= SUPERVISOR_ONLY
    assert wanted - served(text) == set()


def test_the_alert_rules_pass_promtool() -> None:
    """.ci/run installs Debian's prometheus package for promtool and runs this check too."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip(".ci/run installs promtool (Debian's prometheus package)")
    result = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_dashboard_is_grafana_json_with_unique_panel_ids() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert {"datasource", "queue"} <= {v["name"] for v in dashboard["templating"]["list"]}
    titles = " ".join(panel["title"] for panel in dashboard["panels"])
    for subject in ("Jobs per second", "Failures", "Lag", "Oldest pending", "Running",
                    "Dead letters", "Handler run time", "Redis"):  # fmt: skip
        assert subject in titles
