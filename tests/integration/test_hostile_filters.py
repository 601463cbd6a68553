"""Poison content filters against the running platform: refused at Subscribe, and one stored
before the checks existed never stops anyone else's delivery."""

from __future__ import annotations

import re
import uuid

import httpx
import pytest

from hpwsn import ns
from tests.support import (
    ANONYMOUS_ALLOWED,
    notify_xml,
    soap_call,
    subscribe_xml,
    topic_with_policy,
    wait_until,
)

pytestmark = pytest.mark.integration

POISON_REGEX = "re:test(., '(')"
EXSLT_RE = "http://exslt.org/regular-expressions"
CUBIC = "count(//*[count(following::*[count(preceding::*) > 0]) > 0]) > 0"


def content(expr: str, nsdecl: str = "") -> str:
    return (
        f'<wsnt:MessageContent Dialect="{ns.FILTER_XPATH}"{nsdecl}>{escape(expr)}'
        "</wsnt:MessageContent>"
    )


def escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@pytest.fixture
def topic(committed) -> str:  # type: ignore[no-untyped-def]
    path = f"Hostile:F{uuid.uuid4().hex[:8]}"
    committed(topic_with_policy, path, root=ANONYMOUS_ALLOWED, **ANONYMOUS_ALLOWED)
    return path


@pytest.mark.parametrize(
    ("expr", "nsdecl", "mentions"),
    [
        (POISON_REGEX, f' xmlns:re="{EXSLT_RE}"', "extension function"),
        ("str:padding(100000000, 'x') = ''", ' xmlns:str="http://exslt.org/strings"', "extension"),
        (CUBIC, "", "quadratic"),
        ("//a[//b]", "", "quadratic"),
        ("//a[following-sibling::b]", "", "quadratic"),
        ("$secret = 1", "", "variables"),
        ("contains(., 'x') or " * 80 + "true()", "", "at most 1024"),
    ],
    ids=[
        "exslt-regex",
        "exslt-strings",
        "cubic-axes",
        "absolute-in-predicate",
        "siblings",
        "variable",
        "too-long",
    ],
)
def test_a_costly_or_extension_filter_is_refused_at_subscribe(
    platform, consumer_factory, topic, expr, nsdecl, mentions
):
    consumer = consumer_factory()
    res = soap_call(
        platform.endpoint, subscribe_xml(consumer.url, topic, extra=content(expr, nsdecl))
    )

    assert res.status == 500, res.body[:500]
    assert res.fault_name == "InvalidMessageContentExpressionFault", res.body[:800]
    assert mentions in res.fault_text, res.fault_text


def test_an_ordinary_filter_is_still_accepted_and_filters(platform, consumer_factory, topic):
    consumer = consumer_factory()
    expr = "boolean(//t:temp[. > 30]) and not(//t:temp[@unit = 'F'])"
    res = soap_call(
        platform.endpoint,
        subscribe_xml(consumer.url, topic, extra=content(expr, ' xmlns:t="urn:t"')),
    )
    assert res.status == 200, res.body[:500]
    for value in (10, 31, 40):
        payload = f'<t:r xmlns:t="urn:t"><t:temp unit="C">{value}</t:temp></t:r>'
        assert soap_call(platform.endpoint, notify_xml((topic, payload))).status == 202

    assert wait_until(lambda: len(consumer.received) >= 2, timeout=20)
    assert sorted(consumer.payload_texts()) == ["31", "40"]


def test_a_poison_filter_stored_before_never_stops_another_subscribers_delivery(
    platform, consumer_factory, committed, topic
):
    """The reported probe: `re:test(., '(')` stored on a subscription of an overlapping topic."""
    poisoned = consumer_factory()
    witness = consumer_factory()
    res = soap_call(
        platform.endpoint,
        subscribe_xml(poisoned.url, topic.split(":")[0], extra=content("true()")),
    )
    assert res.status == 200, res.body[:500]
    poison_id = res.findtext(".//wsnt:SubscriptionReference/wsa:Address").rsplit("/", 1)[1]

    def store_poison() -> None:
        # As a broker without the checks stored it: the row holds the expression as sent.
        from hpwsn_site import state
        from subscriptions.models import Subscription

        Subscription.objects.filter(id=poison_id).update(
            content_filter=POISON_REGEX, content_nsmap={"re": EXSLT_RE}
        )
        state.bump(state.VERSION_SUBS)

    committed(store_poison)
    res = soap_call(platform.endpoint, subscribe_xml(witness.url, topic))
    assert res.status == 200, res.body[:500]

    sent = [f"n{i}" for i in range(50)]
    for text in sent:
        payload = f"<x:v xmlns:x='urn:x'>{text}</x:v>"
        res = soap_call(platform.endpoint, notify_xml((topic, payload)))
        assert res.status == 202, res.body[:500]

    wait_until(lambda: len(witness.received) >= 50, timeout=60)
    assert sorted(witness.payload_texts()) == sorted(sent)  # 50 of 50
    assert poisoned.received == []
    # The failures count against the poisoned subscription, where operators see them.
    failures = platform.redis().hget("hpwsn:filtererr", poison_id)
    assert failures is not None
    assert int(failures) >= 1

    def console_row():  # type: ignore[no-untyped-def]
        from console.selectors import subscription_rows
        from subscriptions.models import Subscription

        return subscription_rows(subs=Subscription.objects.filter(id=poison_id))[0]

    assert committed(console_row).filter_errors >= int(failures)
    metrics = httpx.get(platform.base_url + "/metrics", timeout=10).text
    # Labelled by a tag, never by the id that acts on the subscription.
    assert poison_id not in metrics
    tagged = r'hpwsn_subscription_filter_errors_total\{subscription="[0-9a-f]{12}"\}'
    assert re.search(tagged, metrics)
