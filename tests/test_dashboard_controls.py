"""Operator controls on the dashboard (issue 19): pause, resume and cancel through its API, and
in headless Chromium. Real daemons serving the page on the session's Redis; each effect is
checked where it happens (the pause key, what a daemon starts, the handler's process)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from support import DaemonProcess, free_port, jobd_cli, wait_group, wait_until
from test_dashboard import ARTIFACTS, answers, headless_chromium, http, needs_chromium, shown

Daemon = Callable[..., DaemonProcess]
TOKEN = "controls-token-0123456789"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
BY = f"dashboard:127.0.0.1@{socket.gethostname()}"

CONFIG = """\
redis: {{url: '{{redis}}'}}
shutdown_grace: 2s
metrics: {{listen: '127.0.0.1:{port}'}}
dashboard: {{actions: {actions}, token_file: token}}
defaults:
  command: [{handler}]
  concurrency: 2
  lease: {{renew_every: 200ms, reclaim_after: 2s}}
queues:
  q: {{}}
  other: {{}}
"""
HANDLER = """\
#!/bin/sh
echo "start $JOBD_JOB_ID $$" >> {dir}/ran
trap 'echo "term $JOBD_JOB_ID" >> {dir}/ran; exit 143' TERM
case "$JOBD_JOB_ID" in long*) sleep 60 & wait ;; esac
echo "done $JOBD_JOB_ID" >> {dir}/ran
"""


@dataclass
class Site:
    """A daemon serving the dashboard, and how to call its API."""

    url: str
    daemon: DaemonProcess
    config: Path
    tmp_path: Path

    def headers(self) -> dict[str, str]:
        """The token and the CSRF value the API gives: what an action needs."""
        code, _, body = http(self.url + "/api/overview", headers=BEARER)
        assert code == 200, body
        return {**BEARER, "X-Jobd-CSRF": json.loads(body)["csrf"]}

    def post(self, action: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        code, _, reply = http(self.url + "/api/" + action, "POST", body, self.headers())
        return code, json.loads(reply)

    def get(self, path: str, **query: str) -> tuple[int, dict[str, Any]]:
        """GET /api/PATH?QUERY with the token: the status and the JSON."""
        address = f"{self.url}/api/{path}?{urllib.parse.urlencode(query)}"
        code, _, body = http(address, headers=BEARER)
        return code, json.loads(body)

    def overview(self) -> dict[str, Any]:
        code, body = self.get("overview")
        assert code == 200, body
        return body

    def job(self, queue: str, job_id: str) -> dict[str, Any]:
        code, body = self.get("job", queue=queue, id=job_id)
        assert code == 200, body
        return body

    def events(self) -> list[dict[str, Any]]:
        """The newest events, as the feed's first call gives them."""
        code, body = self.get("events", count="500")
        assert code == 200, body
        return body["events"]

    def ran(self) -> list[str]:
        path = self.tmp_path / "ran"
        return path.read_text().splitlines() if path.exists() else []

    def started(self, job_id: str) -> int | None:
        """The pid of the handler that started ``job_id``, once it has."""
        for line in self.ran():
            word, job, *pid = line.split()
            if (word, job) == ("start", job_id):
                return int(pid[0])
        return None


@pytest.fixture
def site(r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path) -> Site:
    """A daemon with the dashboard on, actions on, behind a token; its groups made."""
    (tmp_path / "token").write_text(TOKEN + "\n")
    handler = script("h.sh", HANDLER.format(dir=tmp_path))
    port = free_port()
    config = write_config(CONFIG.format(port=port, actions="true", handler=handler))
    d = daemon(config)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: answers(url + "/healthz"), what="the dashboard to answer")
    for stream in ("jobd:q", "jobd:other"):
        wait_group(r, stream)
    return Site(url, d, config, tmp_path)


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie counts as gone: it runs nothing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


# -- the API -------------------------------------------------------------------------------------


def test_controls_need_the_token_the_csrf_header_and_a_known_queue(
    r: redis.Redis, site: Site
) -> None:
    url = site.url
    for action, body in (
        ("pause", {"queue": "q"}),
        ("resume", {"queue": "q"}),
        ("cancel", {"queue": "q", "job_ids": ["j"]}),
    ):
        code, _, reply = http(f"{url}/api/{action}", "POST", body)
        assert code == 401, reply
        code, _, reply = http(f"{url}/api/{action}", "POST", body, BEARER)
        assert code == 403 and b"CSRF" in reply
        code, _, reply = http(f"{url}/api/{action}", headers=site.headers())
        assert code == 405, "a GET never acts"
        code, reply_body = site.post(action, {**body, "queue": "nope"})
        assert code == 400 and reply_body["error"] == "give a known queue"
    assert r.exists("{jobd:q}:paused") == 0 and r.exists("{jobd:q}:cancels") == 0
    for bad in (None, [], "j", [1], [""], ["x" * 1025], [f"j{i}" for i in range(101)]):
        code, reply_body = site.post("cancel", {"queue": "q", "job_ids": bad})
        assert code == 400 and "job_ids is a list of 1 to 100" in reply_body["error"], bad
    ask = urllib.request.Request(url + "/api/pause", b"{queue", site.headers(), method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(ask, timeout=10)
    assert refused.value.code == 400 and b"not JSON" in refused.value.read()
    assert r.exists("{jobd:q}:cancels") == 0, "nothing was marked"


def test_controls_are_refused_when_actions_are_off(
    r: redis.Redis, write_config, tmp_path: Path
) -> None:
    (tmp_path / "token").write_text(TOKEN + "\n")
    port = free_port()
    config = write_config(CONFIG.format(port=port, actions="false", handler="/bin/true"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobd", "dashboard", "-c", str(config),
         "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: answers(url + "/healthz"), what="the dashboard to answer")
        code, _, body = http(url + "/api/overview", headers=BEARER)
        overview = json.loads(body)
        assert code == 200 and overview["actions"] is False
        headers = {**BEARER, "X-Jobd-CSRF": overview["csrf"]}
        for action, ask in (("pause", {"queue": "q"}), ("resume", {"queue": "q"}),
                            ("cancel", {"queue": "q", "job_ids": ["j"]})):  # fmt: skip
            code, _, body = http(f"{url}/api/{action}", "POST", ask, headers)
            assert code == 403 and b"actions are off" in body
        assert r.exists("{jobd:q}:paused") == 0 and r.exists("{jobd:q}:cancels") == 0
    finally:
        proc.terminate()
        assert proc.wait(10) == 0


def test_a_pause_from_the_dashboard_holds_a_running_daemon_until_resumed(
    r: redis.Redis, site: Site
) -> None:
    code, reply = site.post("pause", {"queue": "q"})
    assert code == 200 and reply["made"] is True and reply["paused"]["by"] == BY
    assert r.hget("{jobd:q}:paused", "by") == BY.encode(), "the audit trail names the dashboard"
    assert abs(reply["paused"]["since"] - time.time()) < 60
    code, again = site.post("pause", {"queue": "q"})
    assert code == 200 and again["made"] is False and again["paused"] == reply["paused"]
    shown_pause = site.overview()["queues"]
    assert shown_pause["q"]["paused"] == reply["paused"] and shown_pause["other"]["paused"] is None
    site.daemon.wait_log(f"queue=q paused by {BY}: reading nothing")  # its reader saw it
    r.xadd("jobd:q", {"payload": "x", "job_id": "held-1"})
    r.xadd("jobd:other", {"payload": "x", "job_id": "o1"})
    wait_until(lambda: site.started("o1"), what="the queue not paused to run")
    assert site.started("held-1") is None, "the paused queue started nothing"
    assert r.xinfo_groups("jobd:q")[0]["lag"] == 1, "held-1 waits in the stream, undelivered"

    code, reply = site.post("resume", {"queue": "q"})
    assert code == 200 and reply["resumed"] == again["paused"]
    wait_until(lambda: site.started("held-1"), what="the held job to run once resumed")
    assert r.exists("{jobd:q}:paused") == 0
    code, reply = site.post("resume", {"queue": "q"})
    assert code == 200 and reply["resumed"] is None, "it was not paused"
    said = [(e["fields"]["event"], e["fields"].get("by")) for e in site.events()]
    assert [s for s in said if s[0] in ("pause", "resume")] == [("pause", BY), ("resume", BY)]


def test_a_cancel_from_the_dashboard_stops_the_handler_and_says_where_each_job_was(
    r: redis.Redis, site: Site
) -> None:
    r.xadd("jobd:q", {"payload": "x", "job_id": "long-1"})
    pid = wait_until(lambda: site.started("long-1"), what="the long job to start")
    assert isinstance(pid, int) and alive(pid)
    consumer = site.daemon.consumer()
    shown_running = wait_until(lambda: site.overview()["queues"]["q"]["running_jobs"])
    [job] = shown_running  # type: ignore[misc]
    assert (job["job_id"], job["consumer"], job["pid"], job["attempt"]) == (
        "long-1",
        consumer,
        pid,
        1,
    )
    assert abs(job["since"] - time.time()) < 60 and job["deadline"] == job["since"] + 1800
    view = site.job("q", "long-1")
    assert view["state"] == "running" and view["running"]["pid"] == pid
    later = ("enqueue", "-c", str(site.config), "q", "x", "--job-id", "later", "--delay", "1h")
    assert jobd_cli(*later).returncode == 0
    code, reply = site.post("cancel", {"queue": "q", "job_ids": ["long-1", "later", "nowhere"]})
    assert code == 200, reply
    found = {f["job_id"]: f for f in reply["found"]}
    assert list(found) == ["long-1", "later", "nowhere"]
    running = found["long-1"]
    assert running["where"] == "running" and running["consumer"] == site.daemon.consumer()
    assert running["said"].startswith(f"running on {running['consumer']} (entry ")
    assert found["later"]["where"] == "delayed" and found["later"]["due"] > time.time() + 3000
    nowhere = found["nowhere"]
    assert nowhere["where"] == "marked" and "cancelled if it is read" in nowhere["said"]
    wait_until(lambda: not alive(pid), 5, "the handler to be stopped")
    assert "term long-1" in site.ran() and "done long-1" not in site.ran()
    wait_until(lambda: r.xpending("jobd:q", "jobd")["pending"] == 0, what="the cancelled ack")
    assert r.zcard("{jobd:q}:delayed") == 0 and r.xlen("{jobd:q}:dead") == 0, "no retry, no DLQ"
    site.daemon.wait_log("cancelled (jobd cancel); stopping the handler")
    # Its history says so, and the events feed names who asked.
    view = wait_until(lambda: (v := site.job("q", "long-1"))["state"] == "cancelled" and v)
    assert view["records"][-1]["event"] == "cancelled" and view["running"] is None  # type: ignore[index]
    assert site.job("q", "later")["state"] == "cancelled"
    asked = [e["fields"] for e in site.events() if e["fields"]["event"] == "cancel"]
    assert {(f["job"], f["by"]) for f in asked} == {(j, BY) for j in found}
    assert site.overview()["queues"]["q"]["running_jobs"] == []


def test_the_overview_shows_the_next_delayed_jobs_without_payloads(
    r: redis.Redis, site: Site
) -> None:
    for hours in range(7, 0, -1):
        enqueue = ("enqueue", "-c", str(site.config), "q", f"secret-{hours}",
                   "--job-id", f"in-{hours}h", "--delay", f"{hours}h")  # fmt: skip
        assert jobd_cli(*enqueue).returncode == 0
    q = site.overview()["queues"]["q"]
    assert q["delayed"] == 7
    shown_delayed = q["next_delayed"]
    assert [j["job_id"] for j in shown_delayed] == [f"in-{h}h" for h in range(1, 6)]
    assert all(j["attempt"] == "1" and j["level"] is None for j in shown_delayed)
    dues = [j["due"] for j in shown_delayed]
    assert dues == sorted(dues) and abs(dues[0] - time.time() - 3600) < 60
    assert "secret" not in json.dumps(q["next_delayed"])


def test_lookups_need_the_token_and_sane_parameters(site: Site) -> None:
    for path in ("job?queue=q&id=j", "events", "events?after=%7B%7D"):
        assert http(f"{site.url}/api/{path}")[0] == 401
    for query, why in (
        ({"queue": "nope", "id": "j"}, "give a known queue"),
        ({"queue": "q"}, "give id once"),
        ({"queue": "q", "id": ""}, "id is a job id of 1 to 1024"),
        ({"queue": "q", "id": "x" * 1025}, "id is a job id of 1 to 1024"),
    ):
        code, body = site.get("job", **query)
        assert code == 400 and body["error"].startswith(why), body
    for query, why in (
        ({"after": "[1]"}, "after is the cursor"),
        ({"after": '{"q": "now"}'}, "after is the cursor"),
        ({"count": "0"}, "count is a number of events, 1 to 500"),
        ({"count": "²"}, "count is a number of events, 1 to 500"),
    ):
        code, body = site.get("events", **query)
        assert code == 400 and body["error"].startswith(why), body
    assert site.job("q", "never-seen")["state"] == "unknown"


# -- the page in a browser -----------------------------------------------------------------------


def queue_section(driver: Any, name: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, "queue-" + name)


def section_text(driver: Any, name: str) -> str:
    """What the page shows of queue ``name``; '' until it is drawn (or while it is redrawn)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        return str(queue_section(driver, name).text)
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


def click(driver: Any, xpath: str) -> None:
    """Click the element at ``xpath`` once it is there (the page redraws every few seconds)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    def clicked() -> bool:
        try:
            found = driver.find_elements(By.XPATH, xpath)
            if found:
                found[0].click()
            return bool(found)
        except StaleElementReferenceException:
            return False

    wait_until(clicked, what=f"{xpath} to click")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    with headless_chromium(tmp_path) as driver:
        yield driver


def text_of(driver: Any, element_id: str) -> str:
    """What the page shows in element ``element_id``; '' while it is missing or redrawn."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        return shown(driver, element_id)
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


def confirm(driver: Any) -> None:
    """Accept the confirm() dialog the page opened."""
    from selenium.common.exceptions import NoAlertPresentException

    def accepted() -> bool:
        try:
            driver.switch_to.alert.accept()
        except NoAlertPresentException:
            return False
        return True

    wait_until(accepted, what="the page to ask")


@needs_chromium
def test_pause_resume_and_cancel_in_headless_chromium(
    r: redis.Redis, site: Site, browser: Any
) -> None:
    r.xadd("jobd:q", {"payload": "x", "job_id": "long-1"})
    pid = wait_until(lambda: site.started("long-1"), what="the long job to start")
    driver = browser
    driver.get(site.url + f"/#token={TOKEN}")
    wait_until(lambda: "Queues (2)" in text_of(driver, "queues"), what="the overview")
    driver.get(site.url + "/#/queue/q/running")
    wait_until(lambda: "Pause" in section_text(driver, "q"), what="the page with actions")
    click(driver, "//section[@id='queue-q']//button[text()='Pause']")
    wait_until(lambda: r.exists("{jobd:q}:paused"), what="the pause key")
    assert r.hget("{jobd:q}:paused", "by") == BY.encode()
    wait_until(lambda: "PAUSED" in section_text(driver, "q"), what="the page to say so")
    banner = shown(driver, "paused")
    assert "PAUSED q since" in banner and BY in banner and "other" not in banner
    assert "paused" in queue_section(driver, "q").get_attribute("class").split()
    assert f"by {BY}" in queue_section(driver, "q").text
    # A pause lets running jobs run: long-1 is on the list, with its handler's pid.
    wait_until(lambda: f"pid {pid}" in text_of(driver, "jobs"), what="the running job")
    assert "long-1" in text_of(driver, "jobs") and alive(pid)  # type: ignore[arg-type]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(ARTIFACTS / "dashboard-paused.png"))
    click(driver, "//section[@id='queue-q']//button[text()='Resume']")
    wait_until(lambda: not r.exists("{jobd:q}:paused"), what="the resume")
    wait_until(lambda: "PAUSED" not in section_text(driver, "q"), what="the page to say so")
    assert not driver.find_element("id", "paused").is_displayed()

    click(driver, "//div[@id='jobs']//tr[@data-job='long-1']//input[@type='checkbox']")
    click(driver, "//button[@id='cancel-selected']")
    confirm(driver)
    wait_until(lambda: not alive(pid), 10, "the handler to be stopped")  # type: ignore[arg-type]
    wait_until(lambda: site.job("q", "long-1")["state"] == "cancelled", what="its outcome")
    assert "term long-1" in site.ran() and "done long-1" not in site.ran()
    wait_until(lambda: "cancel long-1: running on " in text_of(driver, "notice"), what="a notice")
    wait_until(lambda: "long-1" not in text_of(driver, "jobs"), what="the list without it")
    # The lookup shows its history; the feed shows who asked.
    driver.get(site.url + "/#/")
    wait_until(lambda: driver.find_elements("id", "lookup-id"), what="the lookup")
    driver.find_element("id", "lookup-id").send_keys("long-1\n")
    wait_until(lambda: "long-1 of q: cancelled" in text_of(driver, "job"), what="the lookup")
    page = text_of(driver, "job")
    driver.get(site.url + "/#/")
    wait_until(lambda: f"cancel\tlong-1\t{BY}" in text_of(driver, "events"), what="the feed")
    assert f"pause\t\t{BY}" in text_of(driver, "events") and "cancelled" in text_of(
        driver, "events"
    )
    assert driver.save_screenshot(str(ARTIFACTS / "dashboard-controls.png"))
    page += text_of(driver, "events") + text_of(driver, "queues")
    assert "null" not in page and "undefined" not in page, page
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, f"console errors: {errors}"


@needs_chromium
def test_what_redis_holds_is_shown_as_text_never_as_markup(
    r: redis.Redis, site: Site, browser: Any
) -> None:
    """A pause key, job ids, dead letters, history records: anyone who can write to Redis (or
    enqueue) chooses them; every view of the page shows them as text: the overview, a queue's
    page in each of its states, a job's page, the events."""
    markup = '<img src=x onerror="window.pwned=1"><b>bold</b>'
    r.hset("{jobd:q}:paused", mapping={"since": int(time.time() * 1000), "by": markup})
    enqueue = ("enqueue", "-c", str(site.config), "other", "x", "--job-id", markup, "--delay", "1h")
    assert jobd_cli(*enqueue).returncode == 0
    site.daemon.wait_log("queue=q paused by")  # its reader saw the pause: it reads no more
    r.xadd("jobd:q", {"payload": markup, "job_id": markup + "-waiting"})  # paused: it waits
    r.xadd("{jobd:q}:dead", {
        "payload": markup, "jobd_job_id": markup + "-dead", "jobd_error": markup,
        "jobd_exit_code": markup, "jobd_attempts": markup, "jobd_failed_at": markup,
        "jobd_stderr": markup,
    })  # fmt: skip
    r.hset("{jobd:q}:history", markup + "-done", json.dumps({
        "event": markup, "at": int(time.time() * 1000), "attempt": 1, "consumer": markup,
        "error": markup, "stdout": markup, "stderr": markup}) + "\n")  # fmt: skip
    r.zadd("{jobd:q}:history:at", {markup + "-done": int(time.time() * 1000)})
    r.xadd("{jobd:q}:events", {"event": markup, "job": markup, "by": markup, "error": markup})
    driver = browser
    driver.get(site.url + f"/#token={TOKEN}")
    views = {
        "/#/": ("queues", "paused"),
        "/#/queue/q": ("queues", "q"),
        "/#/queue/q/waiting": ("jobs", "-waiting"),
        "/#/queue/q/dead": ("jobs", "-dead"),
        "/#/queue/q/recent": ("jobs", "-done"),
        "/#/queue/other/delayed": ("jobs", "other"),
        "/#/job/q/" + urllib.parse.quote(markup + "-done", safe=""): ("job", "-done"),
    }
    for address, (element, why) in views.items():
        driver.get(site.url + address)
        wait_until(lambda e=element: markup in text_of(driver, e), what=f"{address}: {why}")
        assert markup in shown(driver, "paused")
        assert driver.execute_script("return document.querySelectorAll('img').length") == 0
        bold = "return [...document.querySelectorAll('b')].filter((b) => b.textContent === 'bold')"
        assert driver.execute_script(bold + ".length") == 0, address
        assert driver.execute_script("return window.pwned") is None, address
    driver.get(site.url + "/#/")
    wait_until(lambda: markup in text_of(driver, "events"), what="the events")
    assert driver.execute_script("return document.querySelectorAll('img').length") == 0
