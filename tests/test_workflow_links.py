"""A job's workflow links where people look (issue 35, "seen everywhere"): `jobd job --json` has
top-level parent, follow_ups, after and batch; the dashboard's /api/job the same, /api/batch a
batch's progress, and the job page shows them as links. A real daemon serving the API."""

from __future__ import annotations

import json
from pathlib import Path

import redis
from support import free_port, wait_until
from test_after_batches import CALLBACK, RUNS, Daemon, cli, events, queues_yaml, records
from test_dashboard import headless_chromium, http, needs_chromium, shown

# Done; enqueues one follow-up into b, job id kid (its payload: "kid").
PARENT = """\
#!/bin/sh
cat > /dev/null
printf '%s\\n' '{"queue": "b", "payload": "kid", "job_id": "kid"}' > "$JOBD_ENQUEUE"
"""


def setup(r: redis.Redis, write_config, script, daemon: Daemon) -> tuple[Path, str]:
    """Queues a, b, cb and p (its handler the parent); p's job "mom" done with its follow-up
    "kid" in b; "w" of a done after "x" and b's "kid", all three members of batch L; "held"
    waits for "never". The daemon's API URL."""
    port = free_port()
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + f"metrics: {{listen: '127.0.0.1:{port}'}}\n"
                       + queues_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK))
                       + f"  p:\n    command: [{script('p.sh', PARENT)}]\n")  # fmt: skip
    daemon(cfg)
    cli(cfg, "enqueue", "a", "w", "--job-id", "w", "--after", "x", "--after", "b:kid",
        "--batch", "L")  # fmt: skip
    cli(cfg, "enqueue", "a", "x", "--job-id", "x", "--batch", "L")
    cli(cfg, "enqueue", "a", "held", "--job-id", "held", "--after", "never", "--batch", "L")
    cli(cfg, "enqueue", "p", "", "--job-id", "mom")
    wait_until(lambda: "done" in events(records(r, "jobd:a", "w")), what="w done")
    return cfg, f"http://127.0.0.1:{port}"


def test_job_json_and_the_api_name_a_jobs_links(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    cfg, url = setup(r, write_config, script, daemon)
    w = json.loads(cli(cfg, "job", "a", "w", "--json"))
    assert (w["batch"], w["parent"], w["follow_ups"]) == ("L", None, None)
    assert w["after"] == {"all": ["a x", "b kid"], "left": [], "any": False}
    kid = json.loads(cli(cfg, "job", "b", "kid", "--json"))
    assert kid["parent"].startswith("p mom") and kid["batch"] is None, kid
    mom = json.loads(cli(cfg, "job", "p", "mom", "--json"))
    assert mom["follow_ups"] == {"count": 1, "jobs": ["b kid"]}
    held = json.loads(cli(cfg, "job", "a", "held", "--json"))
    assert held["state"] == "held"
    assert held["after"] == {"all": ["a never"], "left": ["a never"], "any": False}
    api = json.loads(http(url + "/api/job?queue=a&id=w")[2])
    assert (api["batch"], api["after"]) == ("L", w["after"])
    code, _, body = http(url + "/api/batch?id=L")
    assert code == 200, body
    progress = json.loads(body)
    # which batch of the id: the one w's records name (the page shows its progress as w's)
    assert progress.pop("incarnation") == w["batch_incarnation"] == api["batch_incarnation"]
    assert (w["batch_left"], api["batch_left"]) == (False, False)
    assert progress == {"batch": "L", "state": "sealed", "total": 3, "done": 2,
                                "failed": 0, "pending": 1, "found": True,
                                "on_complete": None}  # fmt: skip
    assert json.loads(http(url + "/api/batch?id=nope")[2]) == {"batch": "nope", "found": False}
    assert http(url + "/api/batch?id=a%20b")[0] == 400


@needs_chromium
def test_the_job_page_links_parent_follow_ups_dependencies_and_batch(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    _, url = setup(r, write_config, script, daemon)
    with headless_chromium(tmp_path) as driver:
        driver.get(url + "/#/job/a/w")
        wait_until(lambda: "sealed: 3 in all, 2 done, 0 failed, 1 pending" in shown(driver, "job"),
                   what="w's page with its batch's progress")  # fmt: skip
        links = {a.text: a.get_attribute("href") for a in
                 driver.find_elements(By.CSS_SELECTOR, "#job dl.links a")}  # fmt: skip
        assert links["x"].endswith("#/job/a/x") and links["kid"].endswith("#/job/b/kid")
        assert "0 of 2 left" in shown(driver, "job")
        driver.get(url + "/#/job/p/mom")
        wait_until(lambda: "follow-ups" in shown(driver, "job"), what="mom's follow-ups")
        (kid,) = driver.find_elements(By.CSS_SELECTOR, "#job dl.links a")
        kid.click()
        wait_until(lambda: "parent" in shown(driver, "job"), what="kid's page, its parent")
        (mom,) = driver.find_elements(By.CSS_SELECTOR, "#job dl.links a")
        assert mom.get_attribute("href").endswith("#/job/p/mom")
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, f"console errors: {errors}"
