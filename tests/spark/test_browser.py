"""The analytics page in headless Chromium: an operator runs the jobs and watches Spark's progress
to the end; an analyst then reads the charts and may not start a run."""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from spark.synth import generate
from tests.conftest import ROOT
from tests.support import wait_or_fail

pytestmark = pytest.mark.integration

OUTPUT = ROOT / "test-output"
CHARTS = (
    "chart-traffic",
    "chart-latency",
    "chart-latency-time",
    "chart-health",
    "chart-top",
    "chart-sizes",
    "chart-fragments",
    "chart-heatmap",
)


def _login(browser, platform, ldap_directory, uid: str) -> None:  # type: ignore[no-untyped-def]
    browser.delete_all_cookies()
    browser.get(platform.base_url + "/analytics/")
    assert "/console/login/" in browser.current_url
    browser.find_element("id", "id_username").send_keys(uid)
    browser.find_element("id", "id_password").send_keys(ldap_directory.demo_password(uid))
    browser.find_element("id", "login-submit").click()
    # The login page's own address ends with "?next=/analytics/": wait for the page itself.
    wait_or_fail(
        lambda: (
            urlsplit(browser.current_url).path == "/analytics/"
            and browser.find_elements("id", "role")
        ),
        15,
        "the page after login",
    )


def _painted(browser, canvas_id: str) -> int:  # type: ignore[no-untyped-def]
    return int(
        browser.execute_script(
            "const c = document.getElementById(arguments[0]);"
            "const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
            "let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n;",
            canvas_id,
        )
    )


def test_an_operator_runs_the_jobs_and_an_analyst_reads_the_charts(
    platform, browser, ldap_directory
):  # type: ignore[no-untyped-def]
    events = Path(platform.env["HPWSN_DATA_DIR"]) / "events"
    assert generate(events, events=20_000, days=2, end=time.time()) > 15_000

    _login(browser, platform, ldap_directory, "operator1")
    # The address changes before the page is built: wait for the operator's button.
    wait_or_fail(lambda: browser.find_elements("id", "run-now"), 15, "the operator's run button")
    browser.find_element("id", "run-now").click()
    bar = browser.find_element("id", "run-progress")
    seen: set[float] = set()
    texts: set[str] = set()

    def finished() -> bool:
        value = float(bar.get_attribute("value") or 0)
        seen.add(round(value, 3))
        texts.add(browser.find_element("id", "run-progress-text").text)
        return bar.get_attribute("data-state") in ("succeeded", "failed")

    wait_or_fail(finished, 600, "the run to finish")
    assert bar.get_attribute("data-state") == "succeeded", browser.find_element(
        "id", "run-error"
    ).text
    # The bar moved through the run, not only at its end, and named Spark's tasks on the way.
    assert any(0 < v < 1 for v in seen), seen
    assert any("tasks" in t for t in texts), texts
    assert float(bar.get_attribute("value")) == 1.0
    browser.find_element("id", "run-result-link").click()
    wait_or_fail(lambda: "?run=" in browser.current_url, 15, "the run's page")

    _login(browser, platform, ldap_directory, "analyst1")
    assert browser.find_element("id", "role").text.startswith("analyst")
    assert not browser.find_elements("id", "run-now")
    assert browser.find_elements("id", "run-readonly")
    rows = browser.find_elements("css selector", "#runs tbody tr[data-status=succeeded]")
    assert rows
    for chart in CHARTS:
        assert int(browser.find_element("id", chart).get_attribute("data-points") or 0) > 0, chart
        assert _painted(browser, chart) > 1000, chart
    health = browser.find_elements("css selector", "#health-table tbody tr")
    assert len(health) >= 10
    # A drill-down redraws: another subtree of the topic tree.
    picked = browser.execute_script(
        "const s = document.getElementById('topic-pick');"
        "s.value = [...s.options].map(o => o.value).find(v => v && v !== 'ALL');"
        "s.dispatchEvent(new Event('change'));"
        "return s.value;"
    )
    assert picked
    assert f"subtree {picked}" in browser.find_element("id", "traffic-scope").text
    assert int(browser.find_element("id", "chart-traffic").get_attribute("data-points")) > 0

    # The analyst's own request to start a run is refused with a problem response.
    answer = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "const token = document.cookie.split('; ').find(c => c.startsWith('csrftoken='));"
        "const body = new FormData();"
        "body.set('since', '2026-01-01T00:00'); body.set('until', '2026-01-02T00:00');"
        "fetch('/analytics/runs/', {method: 'POST', body, credentials: 'same-origin',"
        "  headers: {'X-CSRFToken': token ? token.split('=')[1] : ''}})"
        ".then(r => r.json().then(j => done([r.status, r.headers.get('content-type'), j.detail])));"
    )
    assert answer[0] == 403
    assert answer[1] == "application/problem+json"
    assert "operators and admins" in answer[2]

    OUTPUT.mkdir(exist_ok=True)
    shot = OUTPUT / "analytics.png"
    browser.set_window_size(1400, 2600)
    assert browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 50_000
