"""Text that users, publishers, consumers and peers control is shown as text on every page, in
headless Chromium: it never runs as script, never adds elements and never becomes a link.

Each test stores hostile values through the services that store them in production (topics,
subscriptions, registrations, dead letters from a consumer's answer, audit entries, API tokens,
node heartbeats and traffic counters, analytics results), opens the pages that show them, waits
for them to be drawn (the dashboard's tables come over its WebSocket) and checks that no payload
ran, no element was injected, and the payload reads back literally where the page shows it.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from urllib.parse import quote, urlsplit

import pytest

from hpwsn import ns
from hpwsn.wsn import TopicRef
from tests.console.conftest import PASSWORD, make_user
from tests.support import notify_xml, soap_call, wait_or_fail

pytestmark = pytest.mark.integration

P_IMG = '<img src=x onerror="window.__pwned=1">'
P_SCRIPT = "</script><script>window.__pwned=1</script>"
P_SVG = '"><svg onload=window.__pwned=1>'
# Free text (descriptions, error bodies, labels): closes the elements text may sit in first.
HOSTILE = "</textarea></title>" + P_IMG + P_SCRIPT + P_SVG
# Values that may hold no space (URLs, namespaces) and a link's scheme.
P_URL = '"><svg/onload=window.__pwned=1></script><script>window.__pwned=1</script>'
P_JS_URL = "javascript:window.__pwned=1//" + P_URL
# A user name (at most 150 characters): it is in every page's header and in the audit log.
USERNAME = "op" + P_IMG + P_SCRIPT + P_SVG
# An API token's name (at most 100 characters).
TOKEN_NAME = P_IMG + P_SVG

# Run in the page: whether a payload ran (window.__pwned), and the elements a payload would have
# added (an event handler naming the marker, a script setting it, a javascript: link). They are
# there as soon as the markup is parsed, before an image's error event fires.
_INERT = """
const hits = [];
for (const el of document.querySelectorAll('*')) {
  for (const a of el.attributes) {
    if (a.name.toLowerCase().startsWith('on') && a.value.includes('__pwned'))
      hits.push(el.tagName + ' ' + a.name + '=' + a.value);
  }
  if (el.tagName === 'SCRIPT' && el.textContent.trim() === 'window.__pwned=1')
    hits.push('script: ' + el.outerHTML);
}
for (const a of document.querySelectorAll('a[href], area[href], iframe[src], form[action]')) {
  const url = (a.getAttribute('href') || a.getAttribute('src') || a.getAttribute('action'));
  if (url.trim().toLowerCase().startsWith('javascript:')) hits.push('link: ' + url);
}
return [window.__pwned === undefined ? null : String(window.__pwned), hits];
"""


def _assert_inert(browser, page: str) -> None:  # type: ignore[no-untyped-def]
    pwned, hits = browser.execute_script(_INERT)
    assert pwned is None, f"{page}: a payload ran (window.__pwned = {pwned})"
    assert hits == [], f"{page}: markup injected by stored text: {hits}"


def _text(browser, css: str) -> str:  # type: ignore[no-untyped-def]
    """The text of every element matching css, joined; "" while the page does not show one."""
    from selenium.common.exceptions import WebDriverException

    try:
        return "\n".join(str(e.text) for e in browser.find_elements("css selector", css))
    except WebDriverException:  # the page was replaced meanwhile
        return ""


def _open(browser, url: str, ready_css: str) -> None:  # type: ignore[no-untyped-def]
    browser.get(url)
    wait_or_fail(
        lambda: browser.find_elements("css selector", ready_css), 15, f"{ready_css} on {url}"
    )


def _shows(browser, css: str, *texts: str, page: str) -> None:  # type: ignore[no-untyped-def]
    shown = _text(browser, css)
    for text in texts:
        assert text in shown, f"{page}: {text!r} is not shown literally in {css}: {shown!r}"


def _hostile_operator(committed):  # type: ignore[no-untyped-def]
    """A local operator account (staff, so the dashboard and the admin open) named with a
    payload: its name is in every page's header, the audit log and the analytics runs."""

    def make():  # type: ignore[no-untyped-def]
        user = make_user(USERNAME, "hpwsn-operators")
        user.is_staff = user.is_superuser = True
        user.save(update_fields=["is_staff", "is_superuser"])
        return user

    return committed(make)


def _login(browser, base_url: str, username: str, password: str) -> None:  # type: ignore[no-untyped-def]
    browser.get(base_url + "/console/login/")
    browser.find_element("id", "id_username").send_keys(username)
    browser.find_element("id", "id_password").send_keys(password)
    browser.find_element("id", "login-submit").click()
    wait_or_fail(
        lambda: urlsplit(browser.current_url).path == "/console/" and _text(browser, "#whoami"),
        15,
        "the console after login",
    )
    assert _text(browser, "#whoami") == username
    _assert_inert(browser, "the console after login")


def test_console_and_admin_pages_show_stored_hostile_text_as_text(
    platform, browser, ldap_directory, committed, consumer_factory, db_access
):
    from django.urls import reverse

    from audit.models import AuditEntry
    from console.services import dead_letters_delete_by_operator, subscription_pause_or_resume
    from dispatch.models import DeadLetter
    from hpwsn_site.api.services import api_token_create
    from subscriptions.models import PublisherRegistration
    from subscriptions.registrations import registration_create, registration_destroy
    from subscriptions.services import subscription_create, subscription_delete
    from topics.acl import Principal
    from topics.models import Topic
    from topics.services import topic_create

    user = _hostile_operator(committed)
    principal = Principal(name=USERNAME, groups=frozenset({"hpwsn-admins"}))
    tag = uuid.uuid4().hex[:8]
    root, leaf = f"HostileNs{tag}", f"ALL:Hostile{tag}"
    committed(topic_create, path=root, namespace="urn:x:" + P_URL, description=HOSTILE, actor=user)
    committed(topic_create, path=leaf, description=HOSTILE, actor=user)
    # The consumer refuses every push with a 400 whose body is a payload: the broker keeps an
    # excerpt of it as the dead letter's last error.
    consumer = consumer_factory(fail_first=1000, fail_status=400, fail_body=P_IMG.encode())
    content = "not(contains(., '" + P_IMG + "'))"
    sub, _created = committed(
        subscription_create,
        consumer_address=consumer.url + "/" + P_URL,
        topic=TopicRef(text=leaf, dialect=None, nsmap={}),
        content=TopicRef(text=content, dialect=ns.FILTER_XPATH, nsmap={}),
        initial_termination_time=None,
        soap_version="1.1",
        use_raw=False,
        base_url=platform.base_url,
        principal=principal,
    )
    reg = committed(
        registration_create,
        publisher_address="http://publisher.example/wsn",
        topics=[TopicRef(text=leaf, dialect=None, nsmap={})],
        demand=False,
        initial_termination_time=None,
        base_url=platform.base_url,
        principal=principal,
    )
    # RegisterPublisher refuses such an address now; a row written before it did keeps it.
    committed(
        lambda: PublisherRegistration.objects.filter(id=reg.id).update(publisher_address=P_JS_URL)
    )
    committed(api_token_create, principal=USERNAME, name=TOKEN_NAME)
    try:
        res = soap_call(platform.endpoint, notify_xml((leaf, "<t xmlns='urn:t'>x</t>")))
        assert res.status == 202, res.body
        wait_or_fail(
            lambda: DeadLetter.objects.filter(subscription_id=str(sub.id)).exists(),
            30,
            "the dead letter of the refused push",
        )
        # An operator's change: an audit entry whose snapshots hold the address and the filter.
        committed(
            subscription_pause_or_resume, subscription_id=str(sub.id), paused=True, actor=user
        )
        assert AuditEntry.objects.filter(actor=USERNAME, object_id=str(sub.id)).exists()

        base = platform.base_url
        _login(browser, base, USERNAME, PASSWORD)

        _open(browser, base + "/console/?q=Hostile", "#tree")
        _assert_inert(browser, "topic tree")

        ns_topic = Topic.objects.get(path=root)
        _open(browser, f"{base}/console/topics/{ns_topic.pk}/", "#topic-path")
        _assert_inert(browser, "topic page of a root")
        _shows(browser, "section.side dl", "urn:x:" + P_URL, page="topic page")
        _shows(browser, "section.side ul.small", USERNAME, page="topic page's recent changes")
        described = browser.find_element("id", "id_description").get_attribute("value")
        assert described == HOSTILE

        leaf_topic = Topic.objects.get(path=leaf)
        _open(browser, f"{base}/console/topics/{leaf_topic.pk}/delete/", "#delete-form")
        _assert_inert(browser, "topic delete page")
        _shows(browser, "table.list", consumer.url + "/" + P_URL, page="topic delete page")

        _open(browser, f"{base}/console/subscriptions/?topic={leaf}", "#subscriptions")
        _assert_inert(browser, "subscriptions")
        _shows(
            browser,
            f'#subscriptions tr[data-id="{sub.id}"]',
            consumer.url + "/" + P_URL,
            "filter: " + content,
            "owner: " + USERNAME,
            page="subscriptions",
        )

        _open(browser, f"{base}/console/deadletters/?subscription={sub.id}", "#deadletters")
        _assert_inert(browser, "dead letters")
        _shows(
            browser, "#deadletters tbody", consumer.url + "/" + P_URL, P_IMG, page="dead letters"
        )

        _open(browser, base + "/console/registrations/", "#registrations")
        _assert_inert(browser, "publishers")
        _shows(browser, f'#registrations tr[data-id="{reg.id}"]', P_JS_URL, page="publishers")

        _open(browser, base + "/console/audit/", "#audit")
        _assert_inert(browser, "audit log")
        _shows(browser, "#audit tbody", USERNAME, root, str(sub.id), page="audit log")
        # The full records (collapsed <details>) hold the snapshots: the description, the
        # consumer address and the filter.
        records = browser.execute_script(
            "return [...document.querySelectorAll('#audit pre')].map(p => p.textContent).join();"
        )
        # pprint splits long strings at their spaces: look for runs without one.
        assert '1"></script><script>window.__pwned=1</script>"><svg' in records  # description
        assert P_URL in records  # consumer address
        assert "onerror=" in records  # filter
        options = browser.execute_script(
            "return [...document.querySelectorAll('#audit-filter option')].map(o => o.value);"
        )
        assert USERNAME in options

        _open(browser, base + "/console/tokens/", "#tokens")
        _assert_inert(browser, "API tokens")
        _shows(browser, "#tokens tbody", TOKEN_NAME, page="API tokens")
        _shows(browser, "main h2", USERNAME, page="API tokens")

        # The dashboard's header names the user (its tables are the next test's).
        _open(browser, base + "/monitoring/", "#conn-status")
        _assert_inert(browser, "monitoring dashboard")
        _shows(browser, "header .status", USERNAME, page="monitoring dashboard")

        for name in (
            "admin:audit_auditentry_changelist",
            "admin:subscriptions_subscription_changelist",
            "admin:dispatch_deadletter_changelist",
            "admin:topics_topic_changelist",
        ):
            _open(browser, base + reverse(name), "#result_list, #changelist")
            _assert_inert(browser, f"admin {name}")
        _open(browser, base + reverse("admin:audit_auditentry_changelist"), "#result_list")
        _shows(browser, "#result_list", USERNAME, page="admin audit entries")
        _open(
            browser,
            base + reverse("admin:subscriptions_subscription_change", args=[sub.id]),
            "#content",
        )
        _assert_inert(browser, "admin subscription page")
        _open(browser, base + reverse("admin:topics_topic_change", args=[ns_topic.pk]), "#content")
        _assert_inert(browser, "admin topic page")
        letter = DeadLetter.objects.filter(subscription_id=str(sub.id)).first()
        assert letter is not None
        _open(
            browser,
            base + reverse("admin:dispatch_deadletter_change", args=[letter.pk]),
            "#content",
        )
        _assert_inert(browser, "admin dead letter page")

        # A read-only analyst sees masked addresses, and the filter and the audit log as text.
        browser.delete_all_cookies()
        _login(browser, base, "analyst1", ldap_directory.demo_password("analyst1"))
        for path, css in (
            (f"/console/subscriptions/?topic={leaf}", "#subscriptions"),
            ("/console/deadletters/", "#deadletters"),
            ("/console/audit/", "#audit"),
            ("/console/registrations/", "#registrations"),
        ):
            _open(browser, base + path, css)
            _assert_inert(browser, f"{path} (analyst)")
        _open(browser, f"{base}/console/subscriptions/?topic={leaf}", "#subscriptions")
        _shows(
            browser, "#subscriptions tbody", "filter: " + content, page="subscriptions (analyst)"
        )
    finally:
        committed(subscription_delete, subscription_id=str(sub.id))
        committed(registration_destroy, registration_id=str(reg.id), principal=None)
        ids = list(
            DeadLetter.objects.filter(subscription_id=str(sub.id)).values_list("id", flat=True)
        )
        committed(dead_letters_delete_by_operator, ids=ids, actor="tests")


def test_forms_and_search_fields_echo_hostile_input_as_text(
    platform, browser, committed, db_access
):
    from topics.models import Topic
    from topics.services import topic_create

    _hostile_operator(committed)
    tag = uuid.uuid4().hex[:8]
    path = f"ALL:Echo{tag}"
    committed(topic_create, path=path)
    base = platform.base_url
    _login(browser, base, USERNAME, PASSWORD)

    # A refused topic path comes back in the form's error and in the field.
    _open(browser, base + "/console/topics/new/", "#create-form")
    browser.find_element("id", "id_path").send_keys("ALL:" + HOSTILE)
    browser.find_element("css selector", "#create-form button[type=submit]").click()
    wait_or_fail(lambda: _text(browser, "#create-form .errorlist"), 15, "the form's error")
    _assert_inert(browser, "new topic form with an error")
    _shows(browser, "#create-form .errorlist", P_IMG, P_SCRIPT, page="new topic form")
    assert browser.find_element("id", "id_path").get_attribute("value") == "ALL:" + HOSTILE

    # A refused new name, on the topic's page.
    pk = Topic.objects.get(path=path).pk
    _open(browser, f"{base}/console/topics/{pk}/", "#rename-form")
    field = browser.find_element("css selector", "#rename-form input[name=name]")
    field.clear()
    field.send_keys(HOSTILE)
    browser.find_element("css selector", "#rename-form button[type=submit]").click()
    wait_or_fail(lambda: _text(browser, "#rename-form .error"), 15, "the rename error")
    _assert_inert(browser, "rename form with an error")
    _shows(browser, "#rename-form .error", P_IMG, page="rename form")

    # A refused policy value.
    _open(browser, f"{base}/console/topics/{pk}/", "#policy-form")
    field = browser.find_element("id", "id_retry_schedule")
    field.send_keys(P_IMG + P_SCRIPT)
    browser.find_element("id", "policy-save").click()
    wait_or_fail(lambda: _text(browser, "#policy-form .field-error"), 15, "the policy error")
    _assert_inert(browser, "policy form with an error")

    # Search fields and the tree's search, filled from the address.
    q = quote(HOSTILE)
    for url, css in (
        (f"/console/?q={q}", "#tree-search"),
        (f"/console/subscriptions/?q={q}&topic={q}", "#sub-filter"),
        (f"/console/audit/?object={q}&who={q}", "#audit-filter"),
        (f"/console/pullpoints/?q={q}", "#pullpoints"),
        (f"/console/registrations/?q={q}", "#registrations"),
        (f"/console/deadletters/?subscription={q}", "#deadletters"),
        (f"/console/topics/new/?parent={q}", "#create-form"),
    ):
        _open(browser, base + url, css)
        _assert_inert(browser, url)
    _open(browser, f"{base}/console/?q={q}", "#tree-search")
    assert browser.find_element("id", "tree-search").get_attribute("value") == HOSTILE.strip()


def test_the_dashboard_draws_hostile_node_topic_and_consumer_labels_as_text(
    platform, browser, committed
):
    from django.conf import settings

    from hpwsn_site import state
    from monitoring import counters, keys
    from monitoring.services import node_heartbeat

    _hostile_operator(committed)
    node_id = f"hostile:{uuid.uuid4().hex[:8]}"
    consumer_address = "http://<img src=x onerror=window.__pwned=1>"
    label = counters.consumer_label(consumer_address)
    assert label == "<img src=x onerror=window.__pwned=1>"

    def beat() -> None:
        now = time.time()
        node_heartbeat(
            node_id=node_id,
            record={
                "id": node_id, "host": HOSTILE, "pid": 1, "role": P_IMG, "node": HOSTILE,
                "name": HOSTILE, "version": P_SVG, "started": now - 60, "pool": None,
                "interval": 3600.0, "dead_after": 7200.0, "cpu": 0.0, "rss": 1, "threads": 1,
                "fds": 1, "procs": 1,
            },
            now=now,
        )  # fmt: skip

    try:
        beat()
        # Counted into the platform's Redis: an earlier test may have left this process's counters
        # on a Redis of its own.
        counters.configure(redis_url=settings.REDIS_URL)
        counters.incr("accepted", 500, topic=HOSTILE)
        counters.incr("failed", 500, consumer=consumer_address)
        assert counters.flush() > 0
        base = platform.base_url
        _login(browser, base, USERNAME, PASSWORD)
        browser.get(base + "/monitoring/")

        def drawn(css: str, text: str) -> bool:
            # A table that parsed the text as markup never shows it: stop waiting once it ran.
            ran = browser.execute_script("return window.__pwned !== undefined;")
            return bool(ran) or text in _text(browser, css)

        wait_or_fail(lambda: drawn("#nodes tbody", HOSTILE), 20, "the node in the nodes table")
        wait_or_fail(lambda: drawn("#topics tbody", HOSTILE), 20, "the topic row")
        wait_or_fail(lambda: drawn("#consumers tbody", label), 20, "the consumer row")
        # The next snapshot redraws the tables: still text.
        shown = _text(browser, "#updated")
        wait_or_fail(lambda: _text(browser, "#updated") != shown, 15, "the next snapshot")
        _assert_inert(browser, "monitoring dashboard")
        _shows(browser, "#topics tbody", HOSTILE, page="top topics")
        _shows(browser, "#consumers tbody", label, page="top failing consumers")
        row = browser.execute_script(
            "return [...document.querySelectorAll('#nodes tbody tr')]"
            ".map(tr => [...tr.cells].map(td => td.textContent))"
            f".find(cells => cells.includes({HOSTILE!r}));"
        )
        assert row is not None
        assert P_IMG in row  # the role
        assert P_SVG in row  # the version
        assert row.count(HOSTILE) == 2  # the name and the host
    finally:
        state.get_redis().hdel(keys.NODES, node_id)


def test_the_analytics_page_draws_hostile_labels_and_errors_as_text(platform, browser, committed):
    from spark.models import AnalyticsRun, JobResult
    from spark.services import analytics_run_create

    user = _hostile_operator(committed)
    until = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    since = until - timedelta(hours=2)
    hours = [(since + timedelta(hours=h)).isoformat() for h in range(2)]

    def store() -> tuple[str, str]:
        failed = analytics_run_create(since=since, until=until, trigger="web", user=user)
        AnalyticsRun.objects.filter(id=failed.id).update(status="failed", error=HOSTILE)
        run = analytics_run_create(since=since, until=until, trigger="web", user=user)
        # The rows the runner stores from Spark's output (spark/services.py), labels included.
        traffic = [
            ["subtree", grain, topic, bucket, 5, 4, 1, 0]
            for topic in ("ALL", HOSTILE)
            for grain in ("hour", "day")
            for bucket in hours
        ]
        latency = [
            ["consumer", HOSTILE, None, 10.0, 20.0, 90.0, 99.0],
            ["consumer", "127.0.0.1:9", None, 1.0, 2.0, 3.0, 4.0],
            *[["consumer", HOSTILE, bucket, 10.0, 20.0, 90.0, 99.0] for bucket in hours],
        ]
        health_columns = [
            "consumer",
            "attempts",
            "failure_rate",
            "http_5xx",
            "http_4xx",
            "timeout",
            "delivered",
            "retries_per_delivered",
            "dead_letters",
            "suspensions",
            "mttr_s",
        ]
        results = {
            "traffic": (
                [
                    "scope",
                    "grain",
                    "topic",
                    "bucket",
                    "published",
                    "delivered",
                    "failed",
                    "expired",
                ],
                traffic,
            ),
            "latency": (
                ["dimension", "key", "bucket", "p50_ms", "p95_ms", "p99_ms", "max_ms"],
                latency,
            ),
            "consumer_health": (health_columns, [[HOSTILE, 10, 0.5, 5, 0, 0, 5, 1.0, 0, 0, None]]),
            "top_n": (
                ["ranking", "rank", "key", "value"],
                [["topics_by_volume", 1, HOSTILE, 10], [P_IMG, 1, HOSTILE, 3]],
            ),
            "sizes": (
                ["kind", "x", "y", "count"],
                [["size", 64, None, 3], ["fragments", 2, None, 1], ["heatmap", 1, 10, 4]],
            ),
            "regressions": (
                ["consumer", "p99_rise_ms", "failure_rate_rise"],
                [[HOSTILE, 50.0, 0.1]],
            ),
        }
        for job, (columns, rows) in results.items():
            JobResult.objects.create(
                run=run, job=job, status="succeeded", columns=columns, rows=rows,
                output_rows=len(rows),
            )  # fmt: skip
        AnalyticsRun.objects.filter(id=run.id).update(
            status="succeeded", input_rows=42, duration_s=1.0, finished_at=until
        )
        return str(run.id), str(failed.id)

    run_id, failed_id = committed(store)
    try:
        base = platform.base_url
        _login(browser, base, USERNAME, PASSWORD)
        _open(browser, f"{base}/analytics/?run={run_id}", "#runs")
        wait_or_fail(
            lambda: browser.find_element("id", "chart-health").get_attribute("data-points"),
            15,
            "the charts",
        )
        _assert_inert(browser, "analytics page")
        _shows(browser, f'#runs tr[data-run="{failed_id}"]', USERNAME, page="run history")
        _shows(browser, f'#runs tr[data-run="{failed_id}"] td.error-text', P_IMG, page="run error")
        _shows(browser, "#health-table tbody", HOSTILE, page="consumer health table")
        _shows(browser, "#latency-key", HOSTILE, page="latency drill-down")
        picks = browser.execute_script(
            "return ['topic-pick', 'consumer-pick', 'ranking-pick'].map(id =>"
            " [...document.getElementById(id).options].map(o => o.textContent));"
        )
        assert HOSTILE in picks[0]
        assert HOSTILE in picks[1]
        assert P_IMG in picks[2]
        labels = browser.execute_script(
            "return ['chart-health', 'chart-top', 'chart-latency', 'chart-regressions']"
            ".map(id => Chart.getChart(id).data.labels);"
        )
        assert all(HOSTILE in drawn for drawn in labels), labels
        # A drill-down to the hostile subtree and to the hostile ranking redraws.
        browser.execute_script(
            "const picks = [['topic-pick', arguments[0]], ['ranking-pick', arguments[1]]];"
            "for (const [id, v] of picks) {"
            "  const s = document.getElementById(id); s.value = v;"
            "  s.dispatchEvent(new Event('change')); }",
            HOSTILE,
            P_IMG,
        )
        _shows(browser, "#traffic-scope", HOSTILE, page="traffic drill-down")
        # Hovering the charts draws their tooltips (on the canvas, never as markup).
        from selenium.webdriver.common.action_chains import ActionChains

        for chart in ("chart-health", "chart-top", "chart-latency"):
            ActionChains(browser).move_to_element(browser.find_element("id", chart)).perform()
        _assert_inert(browser, "analytics page after drill-downs")
    finally:
        committed(lambda: AnalyticsRun.objects.filter(id__in=[run_id, failed_id]).delete())


def test_the_api_docs_keep_a_hostile_query_out_of_their_scripts(platform, browser):  # type: ignore[no-untyped-def]
    q = quote(HOSTILE)
    for path, ready in (
        (f"/api/docs/?lang={q}&version={q}", ".swagger-ui"),
        (f"/api/docs/redoc/?lang={q}&version={q}", "body"),
    ):
        _open(browser, platform.base_url + path, ready)
        _assert_inert(browser, path)
