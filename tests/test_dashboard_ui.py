"""The dashboard's overview, queue and job pages in headless Chromium (issue 36's "done when"):
every queue listed and sortable, 500 waiting jobs paged through, a search, a bulk requeue of
three dead letters (and a forged one refused), a daemon stopped with SIGTERM gone from the list
within 2 s, charts with labelled axes, no horizontal scrolling at 1280×800, dark mode; the
screenshots the docs show are taken here (docs/operations/img/, with
JOBD_UPDATE_DOCS_IMAGES=1). And the page's size budget."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from support import DaemonProcess, acked_all, wait_until
from test_dashboard import ARTIFACTS, headless_chromium, needs_chromium
from test_dashboard import dashboard_cli as dashboard_cli  # a fixture
from test_dashboard_controls import click, confirm

Daemon = Callable[..., DaemonProcess]
TOKEN = "ui-token-0123456789"
DOCS_IMG = Path(__file__).parent.parent / "docs" / "operations" / "img"
PAGE_BUDGET = 80 * 1024  # bytes of the page, its script and its style, uncompressed
QUEUES = ("thumbnails", "emails", "invoices", "reports", "webhooks")
CONFIG = """\
redis: {{url: '{{redis}}'}}
dashboard: {{actions: true, token_file: token}}
defaults: {{command: [{handler}], concurrency: 2, lease: {{renew_every: 300ms, reclaim_after: 3s}}}}
queues:
  thumbnails: {{}}
  emails: {{priorities: [high, low]}}
  invoices: {{}}
  reports: {{}}
  webhooks: {{}}
"""
# The daemon serves thumbnails only (the others are in the dashboard's config, not its): its
# jobs fill the charts; the others keep what the test puts there.
DAEMON = """\
redis: {{url: '{{redis}}'}}
shutdown_grace: 2s
queues:
  thumbnails: {{command: [{handler}], concurrency: 2, lease: {{renew_every: 300ms, reclaim_after: 3s}}}}
"""
HANDLER = """\
#!/bin/sh
case "$(cat)" in
  slow) sleep 0.4 ;;
  bad) echo 'no such image' >&2; exit 65 ;;
esac
exit 0
"""


def js(driver: Any, code: str) -> Any:
    return driver.execute_script(code)


def texts(driver: Any, css: str) -> list[str]:
    return js(driver, f"return [...document.querySelectorAll({css!r})].map((n) => n.textContent)")


def inner(driver: Any, css: str) -> str:
    """What the page shows in the first element ``css`` finds ('' when none): read in the
    page, so a redraw in between is no stale element."""
    return str(
        js(driver, f"const n = document.querySelector({css!r}); return n ? n.innerText : ''")
    )


def no_horizontal_scroll(driver: Any) -> bool:
    return bool(js(driver, "return document.documentElement.scrollWidth <= window.innerWidth"))


def shot(driver: Any, name: str) -> None:
    """A screenshot into the test artifacts; with JOBD_UPDATE_DOCS_IMAGES=1, into the docs too
    (docs/operations/img/: how the docs' pictures are made, without dirtying every run's tree)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(ARTIFACTS / name))
    if os.environ.get("JOBD_UPDATE_DOCS_IMAGES") == "1":
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ARTIFACTS / name, DOCS_IMG / name)


def page_jobs(driver: Any) -> list[str]:
    return texts(driver, "#jobs table tr[data-job] td.job")


@needs_chromium
def test_an_incident_from_the_dashboard_in_headless_chromium(  # long: the whole walk
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path, dashboard_cli
) -> None:
    (tmp_path / "token").write_text(TOKEN + "\n")
    handler = script("h.sh", HANDLER)
    config = write_config(CONFIG.format(handler=handler))
    d = daemon(write_config(DAEMON.format(handler=handler), "daemon.yaml"))
    for i in range(30):
        r.xadd("jobd:thumbnails", {"payload": "slow" if i % 3 == 0 else "ok"})
    r.xadd("jobd:thumbnails", {"payload": "bad", "job_id": "thumb-bad"})
    r.xgroup_create("jobd:invoices", "jobd", id="0", mkstream=True)
    pipe = r.pipeline()
    for i in range(500):
        pipe.xadd("jobd:invoices", {"payload": "secret", "job_id": f"invoice-{i:03}"})
    for i in range(5):
        pipe.xadd("{jobd:invoices}:dead", {
            "payload": "secret", "jobd_job_id": f"dead-{i}", "jobd_error": "exit",
            "jobd_exit_code": "3", "jobd_attempts": "3", "jobd_failed_at": "1795960000000",
            "jobd_stderr": "Traceback: boom\n",
        })  # fmt: skip
    pipe.execute()
    r.hset("{jobd:reports}:paused", mapping={"since": int(time.time() * 1000), "by": "op@ops1"})
    r.hset("{jobd:invoices}:paused", mapping={"since": int(time.time() * 1000), "by": "op@ops1"})
    wait_until(lambda: acked_all(r, "jobd:thumbnails", 31), what="the thumbnails run")
    url = dashboard_cli(config)
    with headless_chromium(tmp_path) as driver:
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": False})  # fmt: skip
        driver.get(url + f"/#token={TOKEN}")
        # The overview: every queue, a row each, sortable; Redis and the daemons above.
        wait_until(lambda: len(texts(driver, "#queue-table tbody tr")) == 5, what="the table")
        assert sorted(js(driver, "return [...document.querySelectorAll('#queue-table tbody tr')]"
                                 ".map((r) => r.dataset.queue)")) == sorted(QUEUES)  # fmt: skip
        click(driver, "//th[@data-key='backlog']")
        wait_until(lambda: texts(driver, "#queue-table tbody tr td:first-child a")[0] == "invoices",
                   what="sorted by backlog, largest first")  # fmt: skip
        row = inner(driver, "#queue-table tr[data-queue='invoices']")
        assert "paused" in row and "500" in row and "op@ops1" in row
        assert "Redis 7" in inner(driver, "#server")
        assert (
            f"times in {js(driver, 'return Intl.DateTimeFormat().resolvedOptions().timeZone')}"
            in (inner(driver, "#updated"))
        )
        wait_until(lambda: d.consumer() in inner(driver, "#daemons"),
                   what="the daemon listed")  # fmt: skip
        assert no_horizontal_scroll(driver)
        shot(driver, "dashboard-overview.png")

        # The queue page: 500 waiting jobs, 50 a page.
        click(driver, "//tr[@data-queue='invoices']/td[2]")
        wait_until(lambda: len(page_jobs(driver)) == 50, what="the first page")
        seen = page_jobs(driver)
        assert "secret" not in inner(driver, "#jobs"), "payloads hidden"
        shot(driver, "dashboard-queue.png")
        for n in range(2, 11):
            click(driver, "//button[@id='next-page']")
            wait_until(lambda n=n: inner(driver, "#page-number") == f"page {n}",
                       what=f"page {n}")  # fmt: skip
            seen += page_jobs(driver)
        assert seen == [f"invoice-{i:03}" for i in range(500)]
        assert js(driver, "return document.getElementById('next-page').disabled")
        # A search finds one job; its id is a link to its page. The table, and the box with it,
        # is redrawn every refresh: what is typed there stays, and the keys typed after a redraw
        # go on into it (typed as a user does, into the focused element).
        from selenium.webdriver.common.action_chains import ActionChains

        js(driver, "document.getElementById('find').focus()")
        ActionChains(driver).send_keys("invoice-3").perform()
        js(driver, "document.getElementById('find').dataset.before = 'redraw'")
        wait_until(lambda: js(driver, "return !document.getElementById('find').dataset.before"),
                   what="a refresh redrawing the box while it is typed into")  # fmt: skip
        ActionChains(driver).send_keys("77\n").perform()
        wait_until(lambda: page_jobs(driver) == ["invoice-377"], what="the search")
        # Read in one script: the page redraws its table every refresh, so an element found
        # by one call can be gone (stale) by the next.
        href = "return document.querySelector('#jobs td.job a').getAttribute('href')"
        assert js(driver, href).endswith("#/job/invoices/invoice-377")

        # Dead letters: three selected, requeued in bulk after a confirmation.
        driver.get(url + "/#/queue/invoices/dead")
        wait_until(lambda: len(page_jobs(driver)) == 5, what="the dead letters")
        for job in ("dead-1", "dead-2", "dead-3"):
            click(driver, f"//tr[@data-job='{job}']//input[@type='checkbox']")
        wait_until(lambda: "(3)" in inner(driver, "#requeue-selected"),
                   what="three selected")  # fmt: skip
        shot(driver, "dashboard-dead-letters.png")
        click(driver, "//button[@id='requeue-selected']")
        confirm(driver)
        wait_until(lambda: r.xlen("{jobd:invoices}:dead") == 2, what="the requeue")
        assert r.xlen("jobd:invoices") == 503
        left = [f[b"jobd_job_id"] for _, f in r.xrange("{jobd:invoices}:dead")]
        assert left == [b"dead-0", b"dead-4"]
        wait_until(lambda: sorted(page_jobs(driver)) == ["dead-0", "dead-4"], what="redrawn")
        # A request forged without the CSRF header (the token alone) is refused.
        forged = """
            const done = arguments[0];
            fetch('/api/dead-letters/purge', {method: 'POST', body: '{"queue": "invoices"}',
              headers: {'Content-Type': 'application/json',
                        'Authorization': 'Bearer ' + sessionStorage.getItem('jobd.token')}})
              .then((r) => r.json().then((j) => done([r.status, j.error])), (e) => done(String(e)));
        """
        assert driver.execute_async_script(forged) == [403, "missing CSRF header"]
        assert r.xlen("{jobd:invoices}:dead") == 2

        # Charts with labelled axes, from the jobs the daemon ran.
        driver.get(url + "/#/queue/thumbnails")
        wait_until(lambda: texts(driver, "#chart-throughput .x-label"), what="the charts")
        for chart, y_label in (("throughput", "jobs per minute"), ("latency", "run time")):
            assert texts(driver, f"#chart-{chart} .y-label")[0].startswith(y_label)
            assert texts(driver, f"#chart-{chart} .x-label")[0].startswith("time (")
            assert len(texts(driver, f"#chart-{chart} .y-tick")) == 5
            assert len(texts(driver, f"#chart-{chart} .x-tick")) >= 4
            drawn = f"return document.querySelectorAll('#chart-{chart} circle').length"
            assert js(driver, drawn), f"no point of {chart} drawn"
        assert "p50" in texts(driver, "#chart-latency .title")[0]
        assert no_horizontal_scroll(driver)
        shot(driver, "dashboard-charts.png")
        js(driver, "window.scrollTo(0, 0)")
        driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {
            "features": [{"name": "prefers-color-scheme", "value": "dark"}]})  # fmt: skip
        background = js(driver, "return getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(11, 17, 32)", background
        shot(driver, "dashboard-dark.png")
        driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})

        # A daemon stopped with SIGTERM leaves the list within 2 s.
        driver.get(url + "/#/")
        gone = d.consumer()
        wait_until(lambda: gone in inner(driver, "#daemons"), what="listed")
        stopped = time.monotonic()
        d.signal(signal.SIGTERM)
        wait_until(lambda: gone not in inner(driver, "#daemons"), 5, "gone")
        took = time.monotonic() - stopped
        print(f"the daemon left the page {took:.2f}s after SIGTERM")
        assert took < 2.0
        assert d.proc.wait(10) == 0
        errors = [
            e
            for e in driver.get_log("browser")
            if e["level"] == "SEVERE" and "/api/dead-letters/purge" not in e["message"]
        ]  # fmt: skip (the forged one)
        assert not errors, f"console errors: {errors}"


def test_the_page_stays_within_its_size_budget_and_loads_nothing_from_elsewhere() -> None:
    static = Path(__file__).parent.parent / "jobd" / "web" / "static"
    files = {p.name: p.read_text() for p in static.iterdir()}
    size = sum(len(text.encode()) for text in files.values())
    assert size <= PAGE_BUDGET, f"the page is {size} bytes, its budget {PAGE_BUDGET}"
    for name, text in files.items():
        names_only = text.replace("http://www.w3.org/2000/svg", "")  # SVG's namespace: a name
        for foreign in ("http://", "https://", "//cdn", "@import", "url(", '<link rel="preload'):
            assert foreign not in names_only, f"{name} loads {foreign}…"
    assert json.dumps(sorted(files)) == '["dashboard.css", "dashboard.js", "index.html"]'
