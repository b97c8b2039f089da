"""Review of issue 36: "Cancel selected (120)" cancels 100 of them, says nothing of the rest,
and clears the selection.

dashboard.js ``bulkButtons``: the confirmation says ``Cancel ${n} job(s)``, the request sends
``chosen.slice(0, 100)`` (the API takes 100 at most), and on success ``view.selected.clear()``.
The selection survives paging (three pages of 50 selected make 120), so an operator who selects
120 waiting jobs and confirms "Cancel 120 job(s)" gets 100 cancelled, 20 left to run, and no
selection left to see which. docs/operations/dashboard.md: "Cancel selected (up to 100 jobs, as
`jobd cancel`)", with a confirmation first.

Headless Chromium on the real `jobd dashboard`, a real daemon serving q (paused), 120 waiting
jobs; every box of the three pages ticked, Cancel selected, the confirmation accepted; then the
API's view of what was cancelled (the notice the page shows).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import redis
from support import jobd_cli, wait_until
from test_dashboard import dashboard_cli as dashboard_cli  # a fixture
from test_dashboard import headless_chromium, needs_chromium
from test_dashboard_controls import click, confirm

TOKEN = "review36-token-0123456789"
JOBS = 120


def js(driver: Any, code: str) -> Any:
    return driver.execute_script(code)


@needs_chromium
def test_cancel_selected_of_120_cancels_100_and_forgets_the_rest(
    r: redis.Redis, write_config: Any, daemon: Any, tmp_path: Path, dashboard_cli: Any
) -> None:
    (tmp_path / "token").write_text(TOKEN + "\n")
    config = write_config(
        "redis: {url: '{redis}'}\ndashboard: {actions: true, token_file: token}\n"
        "queues:\n  q: {command: [/bin/true]}\n"
    )
    assert jobd_cli("pause", "-c", str(config), "q").returncode == 0
    daemon(config)
    wait_until(lambda: r.exists("jobd:q"), what="the daemon's group")
    pipe = r.pipeline()
    for i in range(JOBS):
        pipe.xadd("jobd:q", {"payload": "x", "job_id": f"w-{i:03}"})
    pipe.execute()
    url = dashboard_cli(config)
    with headless_chromium(tmp_path) as driver:
        driver.get(url + f"/#token={TOKEN}")
        wait_until(lambda: js(driver, "return document.querySelector('#queue-table') !== null"),
                   what="the overview")  # fmt: skip
        driver.get(url + "/#/queue/q/waiting")
        for page in range(3):
            wait_until(lambda p=page: js(driver, "return document.getElementById('page-number')"
                                     f"?.textContent === 'page {p + 1}'"),
                       what=f"page {page + 1}")  # fmt: skip
            wait_until(lambda: js(driver, "return document.querySelectorAll("
                                  "'#jobs input[type=checkbox]').length") > 0, what="boxes")  # fmt: skip
            # Each tick redraws the table: tick the first unticked box of the live table.
            js(driver, "for (let i = 0; i < 100; i++) { const c = document.querySelector("
                       "'#jobs input[type=checkbox]:not(:checked)'); if (!c) break; c.click(); }")  # fmt: skip
            if page < 2:
                click(driver, "//button[@id='next-page']")
        label = js(driver, "return document.getElementById('cancel-selected').textContent")
        assert label == f"Cancel selected ({JOBS})", label
        click(driver, "//button[@id='cancel-selected']")
        confirm(driver)
        wait_until(lambda: "cancel w-" in js(driver, "return document.getElementById('notice')"
                                                      ".textContent"), what="the notice")  # fmt: skip
        notice = js(driver, "return document.getElementById('notice').textContent")
        button = "return document.getElementById('cancel-selected').textContent"
        wait_until(lambda: js(driver, button) != label, 15.0, what="the page redrawn")
        after = js(driver, button)
    cancelled = set(re.findall(r"cancel (w-\d{3}): waiting", notice))
    # Expected: the 120 jobs confirmed are cancelled (or the page refuses, keeping the selection).
    assert (len(cancelled), after) == (JOBS, "Cancel selected (0)"), (
        f"{len(cancelled)} of the {JOBS} confirmed were cancelled; the button now says {after!r}; "
        f"the notice: {notice[:160]!r}…"
    )
