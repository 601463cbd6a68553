"""The API docs render in headless Chromium from this server alone (no CDN, no network)."""

from __future__ import annotations

from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait


def test_swagger_ui_and_redoc_show_the_operations(platform, browser):  # type: ignore[no-untyped-def]
    browser.get(platform.base_url + "/api/docs/")
    WebDriverWait(browser, 30).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, ".swagger-ui .opblock"))
    )
    summaries = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")]
    assert "/api/v1/topics/{path}/messages" in [s.replace("\u200b", "") for s in summaries]
    browser.get(platform.base_url + "/api/docs/redoc/")
    WebDriverWait(browser, 30).until(
        lambda d: "Publish one message or a batch" in d.find_element(By.TAG_NAME, "body").text
    )
