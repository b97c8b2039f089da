"""The dashboard: its JSON API against a real daemon, its token and CSRF checks, and the page
itself in headless Chromium."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http import server as http_server
from pathlib import Path
from typing import Any

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
    code, _, page = http(url + "/")  # the page holds no data: it asks for the token
    assert code == 200 and b"/static/dashboard.js" in page and b"secret-payload" not in page
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
    # No cookie carries the token (review 17, 3): a token in a query is refused and sets
    # nothing, and a cookie is never looked at.
    code, headers, body = http(url + f"/?token={TOKEN}")
    assert code == 400 and "Set-Cookie" not in headers and b"#token=" in body
    assert http(url + "/api/overview", headers={"Cookie": f"jobd_token={TOKEN}"})[0] == 401


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


needs_chromium = pytest.mark.skipif(
    chromium() is None,
    reason="no Chromium and ChromeDriver here (Debian: apt-get install chromium chromium-driver; "
    ".ci/run installs them where it can)",
)


@contextlib.contextmanager
def headless_chromium(tmp_path: Path) -> Iterator[Any]:
    """A headless Chromium of this test's own (its profile in ``tmp_path``), closed after."""
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

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
        yield driver
    finally:
        driver.quit()


def shown(driver: Any, element_id: str = "queues") -> str:
    """What the page shows in element ``element_id`` ('' when there is none), read in the page:
    a redraw in between leaves no stale element."""
    found = "const n = document.getElementById(arguments[0]); return n ? n.innerText : ''"
    return str(driver.execute_script(found, element_id))


@needs_chromium
def test_the_page_in_headless_chromium(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
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
    d = daemon(config)
    for i in range(40):
        r.xadd("jobd:q", {"payload": "ok", "job_id": f"thumb-{i}"})
    r.xadd("jobd:q", {"payload": "bad", "job_id": "invoice-42"})
    r.xadd("{jobd:emails}:priority:high", {"payload": "ok"})
    wait_until(lambda: acked_all(r, "jobd:q", 41) and r.xlen("{jobd:q}:dead") == 1)
    assert r.zcard("{jobd:q}:delayed") == 0, "only the bad job failed"
    url = f"http://127.0.0.1:{port}"
    with headless_chromium(tmp_path) as driver:
        driver.get(url + "/")
        wait_until(lambda: "emails" in shown(driver), what="the overview")
        assert "thumbnails" in shown(driver)
        wait_until(lambda: d.consumer() in shown(driver, "daemons"), what="the daemons")
        panel = shown(driver, "daemons")  # the registry: the daemon's row
        assert f"{d.consumer()}\talive" in panel and f"{d.proc.pid}" in panel
        driver.get(url + "/#/queue/thumbnails/dead")
        wait_until(lambda: "invoice-42" in shown(driver), what="the page to show the dead letter")
        assert "no such invoice" in shown(driver)
        driver.get(url + "/#/queue/emails")
        wait_until(lambda: "Priority levels" in shown(driver), what="the levels")
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


# -- the token stays with its port (review 17, 3) --------------------------------------------------


class Catcher(http_server.BaseHTTPRequestHandler):
    """Another local user's web server on another port of 127.0.0.1 (any local dev server
    would do): it keeps the headers of every request a browser sends it."""

    server: CatcherServer

    def do_GET(self) -> None:
        self.server.seen.append(f"{self.path}\n{self.headers.as_string()}")
        body = b"<!doctype html><p>another port</p><img src='/pixel'>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class CatcherServer(http_server.ThreadingHTTPServer):
    daemon_threads = True
    seen: list[str]


@pytest.fixture
def catcher() -> Iterator[tuple[str, list[str]]]:
    """A Catcher on a free loopback port: its URL, and the requests it got."""
    server = CatcherServer(("127.0.0.1", 0), Catcher)
    server.seen = []
    thread = threading.Thread(target=server.serve_forever, name="catcher", daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", server.seen
    server.shutdown()
    server.server_close()
    thread.join(10)


def forget_the_token(driver: Any, url: str) -> None:
    """Open the page without the token: it asks for it."""
    driver.get(url + "/")
    driver.execute_script("sessionStorage.clear()")
    driver.refresh()
    wait_until(lambda: "needs its token" in shown(driver), what="the page to ask for it")


@needs_chromium
def test_a_refusal_of_a_request_sent_before_the_token_came_keeps_the_token(
    r: redis.Redis, write_config, tmp_path: Path, dashboard_cli
) -> None:
    """The page asks for its token, and refreshes each second meanwhile. A refresh sent just
    before the token came in (/#token=…) was refused after it: the page took that refusal as
    the new token's, dropped it and asked again ("that token was refused"; seen in CI, under
    load). A refusal now counts only against the token its request went with."""
    (tmp_path / "token").write_text(TOKEN + "\n")
    url = dashboard_cli(
        write_config(queue_config("[/bin/true]") + "dashboard: {token_file: token}\n")
    )
    with headless_chromium(tmp_path) as driver:
        forget_the_token(driver, url)
        kept = driver.execute_async_script(
            """const done = arguments[arguments.length - 1];
            const asked = get("/api/summary");  // sent now, without a token
            sessionStorage.setItem(TOKEN_KEY, arguments[0]);  // the token comes in meanwhile
            asked.then(() => done(sessionStorage.getItem(TOKEN_KEY)));""",
            TOKEN,
        )
        assert kept == TOKEN, "a refusal of a request sent without it dropped the new token"
        driver.execute_script("refresh(true)")
        wait_until(lambda: "Queues (1)" in shown(driver), what="the page to show the data")


@needs_chromium
def test_the_token_stays_with_its_port_in_headless_chromium(
    r: redis.Redis, write_config, tmp_path: Path, dashboard_cli, catcher
) -> None:
    """The token was a cookie, and cookies ignore ports: every other server on 127.0.0.1 got
    it with every request the browser sent it. Now it goes from the address's fragment into
    this port's sessionStorage and out only as "Authorization: Bearer"."""
    from selenium.webdriver.common.by import By

    (tmp_path / "token").write_text(TOKEN + "\n")
    config = write_config(
        queue_config("[/bin/true]") + "dashboard: {actions: true, token_file: token}\n"
    )
    dead_letter(r, "invoice-42")
    url = dashboard_cli(config)
    other, seen = catcher
    with headless_chromium(tmp_path) as driver:
        driver.get(url + f"/?token={TOKEN}")  # the old way in: refused, sets nothing
        driver.get(url + f"/#token={TOKEN}")
        wait_until(lambda: "Queues (1)" in shown(driver), what="the page to show the data")
        address = driver.current_url
        # A page on another port of the same host gets no token, and can read none.
        driver.get(other + "/")
        wait_until(lambda: len(seen) >= 2, what="the other port's page and its image")
        leaked = [request for request in seen if TOKEN in request or "jobd" in request]
        assert not leaked, f"another port got the token: {leaked}"
        there = "return document.cookie + JSON.stringify([sessionStorage, localStorage])"
        assert TOKEN not in driver.execute_script(there)
        assert address == url + "/", "the token is left in the address bar"
        # Back on the dashboard's port, this tab still has it: the page works and acts.
        driver.get(url + "/#/queue/q/dead")
        wait_until(lambda: "invoice-42" in shown(driver), what="the page to show the data")
        assert driver.get_cookies() == []
        driver.find_element(By.XPATH, "//button[text()='requeue']").click()
        wait_until(lambda: r.xlen("{jobd:q}:dead") == 0, what="the requeue to be done")
        assert r.xlen("jobd:q") == 1
        wait_until(lambda: "No dead letters." in shown(driver), what="the page to show it")
        # A token in the query is refused, says how to open the page, and sets nothing.
        driver.get(url + f"/?token={TOKEN}")
        assert "#token=TOKEN" in driver.find_element(By.TAG_NAME, "body").text
        assert driver.get_cookies() == []
        # Without it the page asks for it: given in the address of the open page (no reload),
        # or in its form, it does as well.
        forget_the_token(driver, url)
        driver.get(url + f"/#token={TOKEN}")
        wait_until(lambda: "Queues (1)" in shown(driver), what="the data again")
        assert driver.current_url == url + "/"
        forget_the_token(driver, url)
        driver.find_element(By.ID, "token").send_keys(TOKEN + "\n")
        wait_until(lambda: "Queues (1)" in shown(driver), what="the data again")


# -- what running handlers tell (issue 34) -----------------------------------------------------

# Tells a hostile status (markup, and bytes that are not UTF-8) and 37.5% on its raw channel,
# then waits for the file ``go``.
TELLER = """\
#!{python}
import os, socket, sys, time
address = os.environ["NOTIFY_SOCKET"]
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
    s.sendto(b"X_JOBD_PROGRESS=37.5\\nSTATUS=<img src=x onerror=window.pwned=1><b>bold</b> caf\\xe9",
             "\\0" + address[1:])
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"""


@needs_chromium
def test_running_jobs_show_a_progress_bar_and_status_as_text_in_headless_chromium(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Issue 34: each running job's row has a bar of its progress and its status line, from
    its active record; a status is text, never markup, its bytes that are not UTF-8 escaped.
    A job that told nothing shows a dash."""
    from selenium.webdriver.common.by import By

    go = tmp_path / "go"
    teller = script("teller.py", TELLER.format(python=sys.executable))
    script("quiet.sh", f"#!/bin/sh\nwhile [ ! -e {go} ]; do sleep 0.05; done\n")
    port = free_port()
    lease = "{renew_every: 300ms, reclaim_after: 3s}"
    config = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  q: {{command: [{teller}, {go}], lease: {lease}}}\n"
        f"  quiet: {{command: [./quiet.sh], lease: {lease}}}\n"
        f"metrics: {{listen: '127.0.0.1:{port}'}}\n"
    )
    daemon(config)
    url = f"http://127.0.0.1:{port}"
    try:
        r.xadd("jobd:q", {"payload": "", "job_id": "talker"})
        r.xadd("jobd:quiet", {"payload": "", "job_id": "silent"})

        def told() -> bool:
            queues = json.loads(http(url + "/api/overview")[2])["queues"]
            running = queues["q"]["running_jobs"] + queues["quiet"]["running_jobs"]
            return len(running) == 2 and any(j["status"] for j in running)

        wait_until(told, what="both running, the talker's status in its active record")
        with headless_chromium(tmp_path) as driver:
            driver.get(url + "/#/queue/q/running")
            wait_until(lambda: "talker" in shown(driver, "jobs"), what="the running list")
            row = driver.find_element(By.CSS_SELECTOR, "#jobs tr[data-job='talker']")
            bar = row.find_element(By.TAG_NAME, "progress")
            assert (bar.get_attribute("value"), bar.get_attribute("max")) == ("37.5", "100")
            status = row.find_element(By.CSS_SELECTOR, "td.told .status").text
            assert status == "<img src=x onerror=window.pwned=1><b>bold</b> caf\\xe9"
            assert "37.5%" in row.text
            assert not driver.find_elements(By.CSS_SELECTOR, "#jobs img, #jobs b")
            assert driver.execute_script("return window.pwned") is None
            assert "running" in row.find_element(By.CSS_SELECTOR, "td.state-busy").text
            driver.get(url + "/#/queue/quiet/running")
            wait_until(lambda: "silent" in shown(driver, "jobs"), what="the quiet one")
            quiet = driver.find_element(By.CSS_SELECTOR, "#jobs tr[data-job='silent']")
            assert quiet.find_elements(By.TAG_NAME, "progress") == []
            assert quiet.find_element(By.CSS_SELECTOR, "td.told").text == "–"
            # The lookup of the running job says them too, as text.
            driver.get(url + "/#/")
            wait_until(lambda: driver.find_elements(By.ID, "lookup-id"), what="the lookup")
            driver.find_element(By.ID, "lookup-id").send_keys("talker\n")
            wait_until(lambda: "37.5% done" in shown(driver, "job"), what="the lookup")
            assert "status: <img src=x onerror=window.pwned=1><b>bold</b> caf\\xe9" in shown(
                driver, "job"
            )
            assert not driver.find_elements(By.CSS_SELECTOR, "#job img, #job b:not(:first-child)")
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            assert driver.save_screenshot(str(ARTIFACTS / "dashboard-progress.png"))
            errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
            assert not errors, f"console errors: {errors}"
    finally:
        go.touch()
    wait_until(lambda: acked_all(r, "jobd:q", 1) and acked_all(r, "jobd:quiet", 1))
