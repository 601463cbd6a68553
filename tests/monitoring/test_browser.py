"""The dashboard as an operator sees it: headless Chromium (Debian's), logged in, live figures."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import pytest

from tests.conftest import ROOT
from tests.support import notify_xml, soap_call, subscribe_xml, wait_or_fail

pytestmark = pytest.mark.integration

OUTPUT = ROOT / "test-output"


def _value(driver, element_id: str) -> int | None:  # type: ignore[no-untyped-def]
    raw = driver.find_element("id", element_id).get_attribute("data-value")
    return int(raw) if raw not in (None, "") else None


def test_the_dashboard_counts_notifications_as_they_are_published(
    platform, browser, staff, consumer_factory
):
    topic, sent = "Monitoring:Browser", 20
    consumer = consumer_factory()
    res = soap_call(platform.endpoint, subscribe_xml(consumer.url, topic))
    assert res.status == 200, res.body

    # The operator logs in through the admin's login page and lands on the dashboard.
    browser.get(platform.base_url + "/monitoring/")
    assert "/admin/login/" in browser.current_url
    browser.find_element("id", "id_username").send_keys(staff.username)
    browser.find_element("id", "id_password").send_keys(staff.password)
    browser.find_element("css selector", "input[type=submit]").click()
    wait_or_fail(
        lambda: urlsplit(browser.current_url).path == "/monitoring/",
        15,
        "the dashboard after login",
    )

    def socket_state() -> str | None:
        found = browser.find_elements("id", "conn-status")  # none while the page still loads
        return found[0].get_attribute("data-state") if found else None

    wait_or_fail(lambda: socket_state() == "live", 15, "the socket to connect")
    wait_or_fail(lambda: _value(browser, "accepted-total") is not None, 15, "the first figures")
    before = _value(browser, "accepted-total")
    assert before is not None

    for i in range(sent):
        body = notify_xml((topic, f"<e:m xmlns:e='urn:t'>{i}</e:m>"))
        assert soap_call(platform.endpoint, body).status == 202
    assert consumer.wait_for(sent), platform.logs()

    wait_or_fail(
        lambda: (_value(browser, "accepted-total") or 0) >= before + sent, 15, "the counter"
    )
    time.sleep(1.5)  # a frame or two more: the count must not overshoot
    assert _value(browser, "accepted-total") == before + sent
    wait_or_fail(
        lambda: (_value(browser, "delivered-pm") or 0) >= sent, 10, "deliveries per minute"
    )

    # Read in one call: the table is drawn again at every frame, and an element found before a
    # frame is stale after it.
    alive_roles = set(
        browser.execute_script(
            "return [...document.querySelectorAll('#nodes tbody tr')]"
            ".filter(r => r.querySelector('.badge.alive'))"
            ".map(r => r.querySelectorAll('td')[1].textContent.trim());"
        )
    )
    assert {"web", "worker", "beat"} <= alive_roles
    topics = browser.find_element("id", "topics").text
    assert topic in topics
    assert socket_state() == "live"
    # The charts are drawn: the throughput canvas has non-background pixels.
    drawn = browser.execute_script(
        "const c = document.getElementById('chart-rate');"
        "const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
        "let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n;"
    )
    assert drawn > 1000

    OUTPUT.mkdir(exist_ok=True)
    shot = OUTPUT / "monitoring-dashboard.png"
    assert browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
