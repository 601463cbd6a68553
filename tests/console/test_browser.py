"""The console as an operator uses it: headless Chromium (Debian's), an LDAP login, a policy edit
that the running broker applies."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import pytest

from tests.conftest import ROOT
from tests.support import notify_xml, soap_call, subscribe_xml, wait_or_fail

pytestmark = pytest.mark.integration

OUTPUT = ROOT / "test-output"
TOPIC = "Console:Browser"


def _text(browser, css: str) -> str:  # type: ignore[no-untyped-def]
    """The text of the first element matching css, or "" while the page does not show it."""
    from selenium.common.exceptions import WebDriverException

    try:
        found = browser.find_elements("css selector", css)
        return str(found[0].text) if found else ""
    except WebDriverException:  # the page was replaced meanwhile (stale or detached node)
        return ""


def _replaced(element) -> bool:  # type: ignore[no-untyped-def]
    """True once the page that held element has been replaced by the next one."""
    from selenium.common.exceptions import WebDriverException

    try:
        element.is_enabled()
    except WebDriverException:  # stale, or "does not belong to the document" mid-navigation
        return True
    return False


def _click_andwait_or_fail(browser, button) -> None:  # type: ignore[no-untyped-def]
    """Submit a form and wait for its answer before the test navigates on."""
    page = browser.find_element("tag name", "html")
    button.click()
    wait_or_fail(lambda: _replaced(page), 15, "the answer to the form")


def _login(browser, platform, ldap_directory, uid: str) -> None:  # type: ignore[no-untyped-def]
    browser.get(platform.base_url + "/console/")
    assert "/console/login/" in browser.current_url
    browser.find_element("id", "id_username").send_keys(uid)
    browser.find_element("id", "id_password").send_keys(ldap_directory.demo_password(uid))
    browser.find_element("id", "login-submit").click()
    wait_or_fail(
        lambda: urlsplit(browser.current_url).path == "/console/", 15, "the console after login"
    )
    wait_or_fail(lambda: _text(browser, "#whoami") == uid, 15, "the console to name the user")


def _set_policy(browser, field: str, value: str) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element("id", f"id_{field}")).select_by_value(value)
    page = browser.find_element("tag name", "html")
    browser.find_element("id", "policy-save").click()
    wait_or_fail(lambda: _replaced(page), 15, "the saved page")
    wait_or_fail(lambda: "saved" in _text(browser, ".messages"), 15, "the policy to be saved")


def _effective(browser, field: str) -> str:  # type: ignore[no-untyped-def]
    return browser.find_element("css selector", f'td.effective[data-field="{field}"]').text


def test_an_operator_lets_a_topic_auto_create_children_and_the_broker_creates_one(
    platform, browser, ldap_directory, committed, db_access
):
    from topics.models import Topic
    from topics.services import topic_create

    committed(topic_create, path=TOPIC)

    # The operator opens the console, is asked to log in, and logs in with the LDAP account.
    _login(browser, platform, ldap_directory, "operator1")
    assert browser.find_element("id", "role").text == "operator"

    # The tree's search finds the topic; the rest of the tree is hidden.
    browser.find_element("id", "tree-search").send_keys("Browser")
    node = browser.find_element("css selector", f'li[data-path="{TOPIC}"]')
    other = browser.find_element("css selector", 'li[data-path="ALL"]')
    assert node.is_displayed()
    assert not other.is_displayed()
    node.find_element("css selector", "a.topic-link").click()
    wait_or_fail(lambda: _text(browser, "#topic-path") == TOPIC, 15, "the topic page")

    # First edit: callers without credentials may publish here. An unknown child is still refused.
    if browser.find_elements("id", "id_anonymous_publish"):
        _set_policy(browser, "anonymous_publish", "true")
    child = f"{TOPIC}:Kid{int(time.time())}"
    refused = soap_call(platform.endpoint, notify_xml((child, "<t xmlns='urn:t'>1</t>")))
    assert refused.fault_name == "TopicNotSupportedFault", refused.body
    assert _effective(browser, "auto_create_children") == "no"

    # Second edit: auto-create children. The broker now accepts the notification and adds the topic.
    _set_policy(browser, "auto_create_children", "true")
    assert _effective(browser, "auto_create_children") == "yes"
    OUTPUT.mkdir(exist_ok=True)
    assert browser.save_screenshot(str(OUTPUT / "console-policy.png"))
    res = soap_call(platform.endpoint, notify_xml((child, "<t xmlns='urn:t'>2</t>")))
    assert res.status == 202, platform.logs()
    assert Topic.objects.filter(path=child).exists()

    # The new child is in the console's tree with the traffic it had, and the audit log names
    # the operator's edits.
    def child_traffic() -> int:
        browser.get(platform.base_url + "/console/?q=" + child.rsplit(":", 1)[1])
        node = browser.find_element("css selector", f'li[data-path="{child}"]')
        assert node.is_displayed()
        return int(node.find_element("css selector", ".count.traffic").get_attribute("data-value"))

    wait_or_fail(lambda: child_traffic() == 1, 15, "the child's accepted notification in the tree")
    browser.get(platform.base_url + "/console/audit/?who=operator1")
    audit = browser.find_element("id", "audit").text
    assert "topic.update" in audit
    assert TOPIC in audit
    assert "auto_create_children" in audit

    browser.get(platform.base_url + "/console/?q=Console")
    shot = OUTPUT / "console-tree.png"
    assert browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000


def test_an_operator_pauses_a_subscription_and_messages_wait_until_resumed(
    platform, browser, ldap_directory, committed, consumer_factory
):
    from topics.services import topic_create, topic_update

    topic = "Console:Pausable"

    def open_topic() -> None:
        t = topic_create(path=topic)
        if "anonymous_subscribe" in {f.name for f in t._meta.get_fields()}:
            topic_update(
                topic_id=t.pk, changes={"anonymous_publish": True, "anonymous_subscribe": True}
            )

    committed(open_topic)
    consumer = consumer_factory()
    res = soap_call(platform.endpoint, subscribe_xml(consumer.url, topic))
    assert res.status == 200, res.body
    _login(browser, platform, ldap_directory, "operator1")

    def row():  # type: ignore[no-untyped-def]
        browser.get(platform.base_url + "/console/subscriptions/?topic=" + topic)
        rows = browser.find_elements("css selector", "#subscriptions tbody tr[data-id]")
        assert len(rows) == 1
        return rows[0]

    _click_andwait_or_fail(browser, row().find_element("css selector", "button.act-pause"))
    assert row().get_attribute("data-state") == "paused"
    assert (
        soap_call(platform.endpoint, notify_xml((topic, "<t xmlns='urn:t'>held</t>"))).status == 202
    )

    # The console shows the message waiting in the paused subscription's queue, undelivered.
    wait_or_fail(
        lambda: row().find_elements("tag name", "td")[5].text == "1", 15, "the queued message"
    )
    assert consumer.received == []
    OUTPUT.mkdir(exist_ok=True)
    assert browser.save_screenshot(str(OUTPUT / "console-subscriptions.png"))

    _click_andwait_or_fail(browser, row().find_element("css selector", "button.act-resume"))
    assert row().get_attribute("data-state") == "active"
    assert consumer.wait_for(1), platform.logs()
    assert consumer.payload_texts() == ["held"]
    browser.get(platform.base_url + "/console/audit/?who=operator1&type=subscription")
    audit = browser.find_element("id", "audit").text
    assert "subscription.pause" in audit
    assert "subscription.resume" in audit
    assert browser.save_screenshot(str(OUTPUT / "console-audit.png"))


def test_an_analyst_sees_the_console_read_only(platform, browser, ldap_directory, db_access):
    from topics.models import Topic

    _login(browser, platform, ldap_directory, "analyst1")
    assert browser.find_element("id", "role").text == "analyst · read-only"
    assert not browser.find_elements("id", "new-topic")

    browser.get(platform.base_url + f"/console/topics/{Topic.objects.get(path='ALL').pk}/")
    assert browser.find_element("id", "topic-path").text == "ALL"
    assert not browser.find_elements("id", "policy-save")
    assert not browser.find_element("id", "id_priority").is_enabled()
    assert not browser.find_elements("id", "rename-form")


def test_an_operator_finds_a_registered_publisher_by_its_owner(
    platform, browser, ldap_directory, db_access
):
    from tests.directory.helpers import BR, register, soap_as

    auth = ("publisher1", ldap_directory.demo_password("publisher1"))
    publisher = f"http://console-{int(time.time())}.example/wsn"
    reg_id, address = register(platform, publisher, "ALL", auth=auth)
    _login(browser, platform, ldap_directory, "operator1")

    browser.get(platform.base_url + "/console/registrations/?q=publisher1")
    row = browser.find_element("css selector", f'#registrations tr[data-id="{reg_id}"]')
    assert row.find_element("css selector", "td.owner").text == "publisher1"
    assert publisher in row.text
    header = browser.find_element("css selector", "#registrations thead").text
    assert "owner" in header.lower()
    OUTPUT.mkdir(exist_ok=True)
    assert browser.save_screenshot(str(OUTPUT / "console-publishers.png"))

    # Another owner's search does not list it.
    browser.get(platform.base_url + "/console/registrations/?q=subscriber1")
    assert not browser.find_elements("css selector", f'#registrations tr[data-id="{reg_id}"]')
    assert soap_as(address, f"<wsnbr:DestroyRegistration {BR}/>", auth).status == 200
