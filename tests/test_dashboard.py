"""The dashboard: its JSON API against a real daemon, its token and CSRF checks, and the page
itself in headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from support import DaemonProcess, acked_all, free_port, queue_config, wait_until

Daemon = Callable[..., DaemonProcess]
TOKEN = "dashboard-token-0123456789"
# Screenshots land here (kept by CI as artifacts; ignored by git).
ARTIFACTS = Path(
    os.environ.get("JOBD_TEST_ARTIFACTS", Path(__file__).parent.parent / "test-artifacts")
)


def http(
    url: str, method: str = "GET", body: dict | None = None, headers: dict | None = None
) -> tuple[int, dict, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(request, timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=1)
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


@pytest.fixture
def dashboard_cli(tmp_path: Path) -> Iterator[Callable[[Path], str]]:
    """`jobd dashboard -c CONFIG --listen 127.0.0.1:PORT`, without a daemon; returns its URL."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(config: Path) -> str:
        port = free_port()
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "jobd", "dashboard", "-c", str(config),
                 "--listen", f"127.0.0.1:{port}"],
                stdout=subprocess.DEVNULL,
            )
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: answers(url + "/healthz"), what="the dashboard to answer")
        return url

    yield start
    for proc in procs:
        proc.terminate()
        assert proc.wait(10) == 0


def dead_letter(r: redis.Redis, job_id: str, stream: str = "{jobd:q}:dead") -> str:
    """A dead-letter record as jobd writes it."""
    return r.xadd(stream, {
        "payload": "secret-payload", "jobd_job_id": job_id, "jobd_queue": "q",
        "jobd_original_id": "1-0", "jobd_error": "exit", "jobd_exit_code": "65",
        "jobd_signal": "", "jobd_attempts": "1", "jobd_failed_at": "1795960000000",
        "jobd_stderr": "Traceback: boom\n",
    }).decode()  # fmt: skip


def test_the_api_against_a_running_daemon(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", '#!/bin/sh\n[ "$(cat)" = bad ] && { echo boom >&2; exit 65; }\nexit 0\n')
    port = free_port()
    config = write_config(
        queue_config("[./h.sh]", concurrency=2) + f"metrics: {{listen: '127.0.0.1:{port}'}}\n"
    )
    daemon(config)
    for payload in ["ok"] * 5 + ["bad"]:
        r.xadd("jobd:q", {"payload": payload})
    wait_until(lambda: acked_all(r, "jobd:q", 6), what="every job settled")
    url = f"http://127.0.0.1:{port}"
    code, headers, body = http(url + "/api/overview")
    assert code == 200 and headers["Content-Type"] == "application/json"
    q = json.loads(body)["queues"]["q"]
    assert sum(q["hour"]["series"]["done"]) == 5 and sum(q["hour"]["series"]["dead"]) == 1
    assert len(q["hour"]["series"]["done"]) == 60
    assert q["hour"]["jobs_timed"] == 6 and q["hour"]["percentiles"]["run"]["p50"] is not None
    assert q["hour"]["percentiles"]["wait"]["p99"] is not None
    # Figures are small and bounded: per-minute hashes that expire.
    [timings] = r.keys("{jobd:q}:timings:*")
    assert 0 < r.ttl(timings) <= 7200 and r.hlen(timings) <= 2 * 16
    [record] = q["dead_letters"]
    assert (record["error"], record["exit_code"], record["attempts"]) == ("exit", "65", "1")
    assert "boom" in record["stderr"] and "payload" not in record, "payloads hidden by default"
    assert q["consumers"] and q["dead_lettered"] == 1
    # The page and its files come from the package; metrics and health still answer.
    code, headers, page = http(url + "/")
    assert code == 200 and b"/static/dashboard.js" in page
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    assert http(url + "/static/dashboard.js")[0] == 200
    assert b"jobd_jobs_started_total" in http(url + "/metrics")[2]
    assert http(url + "/healthz")[2] == b"ok\n"
    # Read-only by default.
    code, _, body = http(url + "/api/dead-letters/purge", "POST", {"queue": "q"})
    assert code == 403 and b"actions are off" in body
    assert r.xlen("{jobd:q}:dead") == 1


def test_actions_need_the_token_and_the_csrf_header(
    r: redis.Redis, write_config, tmp_path: Path, dashboard_cli
) -> None:
    (tmp_path / "token").write_text(TOKEN + "\n")
    config = write_config(
        queue_config("[/bin/true]")
        + "dashboard: {actions: true, token_file: token, show_payloads: true}\n"
    )
    record = dead_letter(r, "j-1")
    url = dashboard_cli(config)
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert http(url + "/api/overview")[0] == 401
    assert http(url + "/")[0] == 401
    assert http(url + "/api/overview", headers={"Authorization": "Bearer wrong"})[0] == 401
    code, _, body = http(url + "/api/overview", headers=bearer)
    overview = json.loads(body)
    assert code == 200 and overview["actions"] is True
    assert overview["queues"]["q"]["dead_letters"][0]["payload"] == "secret-payload"
    csrf = overview["csrf"]
    requeue = {"queue": "q", "ids": [record]}
    assert http(url + "/api/dead-letters/requeue", "POST", requeue)[0] == 401
    code, _, body = http(url + "/api/dead-letters/requeue", "POST", requeue, bearer)
    assert code == 403 and b"CSRF" in body
    assert r.xlen("{jobd:q}:dead") == 1, "nothing done without the CSRF header"
    code, _, body = http(
        url + "/api/dead-letters/requeue", "POST", requeue, {**bearer, "X-Jobd-CSRF": csrf}
    )
    assert code == 200 and json.loads(body)["requeued"] == [record]
    assert r.xlen("{jobd:q}:dead") == 0 and r.xlen("jobd:q") == 1
    # Opening /?token=… once sets an HttpOnly, SameSite=Strict cookie that is then enough.
    code, headers, _ = http(url + f"/?token={TOKEN}")
    assert code == 303 and "HttpOnly" in headers["Set-Cookie"]
    assert "SameSite=Strict" in headers["Set-Cookie"]
    cookie = headers["Set-Cookie"].split(";")[0]
    assert http(url + "/api/overview", headers={"Cookie": cookie})[0] == 200
    assert http(url + "/?token=wrong")[0] == 401


def test_actions_without_a_token_are_refused_by_validate(write_config) -> None:
    from support import jobd_cli

    config = write_config(queue_config("[/bin/true]") + "dashboard: {actions: true}\n")
    out = jobd_cli("validate", str(config))
    assert out.returncode == 78
    assert b"dashboard.actions: actions need a token" in out.stdout


# -- the page in a browser ---------------------------------------------------------------------


def chromium() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@pytest.mark.skipif(
    chromium() is None,
    reason="no Chromium and ChromeDriver here (Debian: apt-get install chromium chromium-driver; "
    ".ci/run installs them where it can)",
)
def test_the_page_in_headless_chromium(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    script(
        "h.sh",
        "#!/bin/sh\n[ \"$(cat)\" = bad ] && { echo 'no such invoice' >&2; exit 65; }\nexit 0\n",
    )
    port = free_port()
    config = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        "  thumbnails: {command: [./h.sh], stream: 'jobd:q', concurrency: 4}\n"
        "  emails: {command: [./h.sh], priorities: [high, low]}\n"
        f"metrics: {{listen: '127.0.0.1:{port}'}}\n"
    )
    daemon(config)
    for i in range(40):
        r.xadd("jobd:q", {"payload": "ok", "job_id": f"thumb-{i}"})
    r.xadd("jobd:q", {"payload": "bad", "job_id": "invoice-42"})
    r.xadd("{jobd:emails}:priority:high", {"payload": "ok"})
    wait_until(lambda: acked_all(r, "jobd:q", 41) and r.xlen("{jobd:q}:dead") == 1)
    assert r.zcard("{jobd:q}:delayed") == 0, "only the bad job failed"
    url = f"http://127.0.0.1:{port}"
    browser, driver_path = chromium()  # type: ignore[misc]
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1280,1400",
                 "--no-proxy-server", "--host-resolver-rules=MAP rebind.test 127.0.0.1",
                 f"--user-data-dir={tmp_path / 'chromium'}"):  # fmt: skip
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        driver.get(url + "/")
        wait_until(
            lambda: "invoice-42" in driver.find_element(By.ID, "queues").text,
            what="the page to show the dead letter",
        )
        text = driver.find_element(By.ID, "queues").text
        assert "thumbnails" in text and "emails" in text and "Priority levels" in text
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        assert driver.save_screenshot(str(ARTIFACTS / "dashboard.png"))
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, f"console errors: {errors}"
        # DNS rebinding: a site whose name resolves to this address gets nothing of it.
        driver.get(f"http://rebind.test:{port}/")
        fetch = "fetch('/api/overview').then((r) => arguments[0](r.status), (e) => arguments[0](String(e)))"
        assert driver.execute_async_script(fetch) == 421
        text = driver.find_element(By.TAG_NAME, "body").text
        assert "misdirected" in text and "invoice-42" not in text and "thumbnails" not in text
    finally:
        driver.quit()
