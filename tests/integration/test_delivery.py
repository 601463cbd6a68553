"""End to end: SOAP over HTTP into the web server, real Celery workers on Redis, real consumers."""

from __future__ import annotations

import time

import pytest
from lxml import etree

from hpwsn import ns
from hpwsn_site import state
from tests.support import notify_xml, soap_call, subscribe_xml, wait_until

pytestmark = pytest.mark.integration


def _subscribe(platform, consumer_url: str, topic: str, **kwargs) -> str:  # type: ignore[no-untyped-def]
    res = soap_call(platform.endpoint, subscribe_xml(consumer_url, topic, **kwargs))
    assert res.status == 200, res.body
    address = res.findtext(".//wsnt:SubscriptionReference/wsa:Address")
    assert address
    return address


def _notify(platform, *messages: tuple[str, str], **kwargs) -> None:  # type: ignore[no-untyped-def]
    res = soap_call(platform.endpoint, notify_xml(*messages, **kwargs))
    assert res.status == 202, res.body


def test_func01_single_node_subscriber_of_all_receives_a_notification_on_all(
    platform, consumer_factory
):
    """Thesis 功能-01: one node, a subscriber of ALL, a publisher on ALL."""
    consumer = consumer_factory()
    address = _subscribe(platform, consumer.url, "ALL")

    _notify(platform, ("ALL", "<e:event xmlns:e='urn:test'>func-01</e:event>"))

    assert consumer.wait_for(1), platform.logs()
    got = consumer.received[0]
    assert consumer.payload_texts() == ["func-01"]
    assert got.topic == "ALL"
    assert got.subscription_address == address
    assert got.to == consumer.url
    assert (got.message_id or "").startswith("urn:uuid:")
    assert got.soap_version == "1.1"


def test_operators_see_when_a_subscription_last_delivered(platform, consumer_factory, db_access):
    from console.selectors import subscription_rows
    from subscriptions.models import Subscription

    consumer = consumer_factory()
    address = _subscribe(platform, consumer.url, "ALL2")
    sub = Subscription.objects.get(id=address.rsplit("/", 1)[1])
    assert subscription_rows(subs=[sub])[0].last_delivery is None

    before = time.time()
    _notify(platform, ("ALL2", "<e:m xmlns:e='urn:t'>seen</e:m>"))
    assert consumer.wait_for(1), platform.logs()

    assert wait_until(lambda: subscription_rows(subs=[sub])[0].last_delivery is not None)
    last = subscription_rows(subs=[sub])[0].last_delivery
    assert last is not None
    assert before <= last.timestamp() <= time.time()


def test_func05_ancestor_subscriber_gets_both_and_descendant_subscriber_only_its_subtree(
    platform, consumer_factory
):
    """Thesis 功能-05: subscribers of an ancestor and a descendant topic; publishers on both."""
    ancestor, descendant = consumer_factory(), consumer_factory()
    _subscribe(platform, ancestor.url, "ALL:ALARM")
    _subscribe(platform, descendant.url, "ALL:ALARM:ALARM1")

    _notify(platform, ("ALL:ALARM", "<e:m xmlns:e='urn:t'>ancestor</e:m>"))
    _notify(platform, ("ALL:ALARM:ALARM1:ALARM11", "<e:m xmlns:e='urn:t'>descendant</e:m>"))

    assert ancestor.wait_for(2), platform.logs()
    assert descendant.wait_for(1)
    time.sleep(0.5)  # a wrongly routed ancestor message would have arrived by now
    assert ancestor.payload_texts() == ["ancestor", "descendant"]
    assert descendant.payload_texts() == ["descendant"]


def test_it_keeps_the_publishers_topic_and_namespace_binding(platform, consumer_factory):
    consumer = consumer_factory()
    _subscribe(platform, consumer.url, "ALL")
    _notify(
        platform,
        ("t:ALL/ALARM/ALARM2", "<e:m xmlns:e='urn:t'>ns</e:m>"),
        dialect=ns.DIALECT_CONCRETE,
        nsdecl=' xmlns:t="urn:example:alarms"',
    )
    assert consumer.wait_for(1)
    got = consumer.received[0]
    assert got.topic == "t:ALL/ALARM/ALARM2"
    assert got.topic_nsmap.get("t") == "urn:example:alarms"


def test_it_pushes_in_the_soap_version_the_consumer_subscribed_with(platform, consumer_factory):
    consumer = consumer_factory()
    res = soap_call(platform.endpoint, subscribe_xml(consumer.url, "Object:Tool"), version="1.2")
    assert res.status == 200
    _notify(platform, ("Object:Tool", "<e:m xmlns:e='urn:t'>v12</e:m>"))
    assert consumer.wait_for(1)
    assert consumer.received[0].soap_version == "1.2"


def test_it_delivers_full_dialect_wildcards_to_every_matching_subtree(platform, consumer_factory):
    consumer = consumer_factory()
    _subscribe(
        platform,
        consumer.url,
        "o:Object/Food/*",
        dialect=ns.DIALECT_FULL,
        nsdecl=' xmlns:o="urn:any"',
    )
    _notify(platform, ("Object:Food:Fruit:Apple", "<e:m xmlns:e='urn:t'>apple</e:m>"))
    _notify(platform, ("Object:Tool", "<e:m xmlns:e='urn:t'>tool</e:m>"))
    _notify(platform, ("Object:Food:Bread", "<e:m xmlns:e='urn:t'>bread</e:m>"))
    assert consumer.wait_for(2)
    time.sleep(0.5)
    assert consumer.payload_texts() == ["apple", "bread"]


def test_a_duplicate_subscription_returns_the_existing_one_and_allocates_nothing(
    platform, consumer_factory, db_access
):
    from subscriptions.models import Subscription

    consumer = consumer_factory()
    first = _subscribe(platform, consumer.url, "ALL:ALARM", termination="PT1H")
    rows_before = Subscription.objects.count()
    second = _subscribe(platform, consumer.url, "ALL:ALARM", termination="PT1H")
    assert second == first
    assert Subscription.objects.count() == rows_before

    _notify(platform, ("ALL:ALARM", "<e:m xmlns:e='urn:t'>once</e:m>"))
    assert consumer.wait_for(1)
    time.sleep(0.5)
    assert consumer.payload_texts() == ["once"]  # one subscription, one delivery


def test_unsubscribe_frees_the_row_the_queue_and_every_key(platform, consumer_factory, db_access):
    from subscriptions.models import Subscription

    consumer = consumer_factory(fail_first=1000)  # keeps messages queued and retrying
    address = _subscribe(platform, consumer.url, "ALL1")
    sub_id = address.rsplit("/", 1)[1]
    _notify(platform, ("ALL1", "<e:m xmlns:e='urn:t'>held</e:m>"))
    r = platform.redis()
    assert wait_until(lambda: r.zscore(state.RETRY, sub_id) is not None), platform.logs()
    assert r.llen(state.queue_key(sub_id)) == 1

    res = soap_call(address, "<wsnt:Unsubscribe/>", to=address)
    assert res.status == 200, res.body
    assert res.find(".//wsnt:UnsubscribeResponse") is not None

    assert not Subscription.objects.filter(id=sub_id).exists()
    assert r.zscore(state.RETRY, sub_id) is None
    assert [k for k in state.subscription_keys(sub_id) if r.exists(k)] == []
    assert not r.hexists(state.SCHED, sub_id)
    # The sweeper that would have retried finds nothing; the consumer gets no more attempts.
    attempts = len(consumer.posts)
    time.sleep(1.5)
    assert len(consumer.posts) == attempts
    assert [k for k in state.subscription_keys(sub_id) if r.exists(k)] == []


def test_an_expired_subscription_receives_nothing_and_is_freed(
    platform, consumer_factory, db_access
):
    from subscriptions.models import Subscription

    consumer = consumer_factory()
    address = _subscribe(platform, consumer.url, "ALL2", termination="PT1S")
    sub_id = address.rsplit("/", 1)[1]
    time.sleep(1.2)
    _notify(platform, ("ALL2", "<e:m xmlns:e='urn:t'>too late</e:m>"))
    assert wait_until(lambda: not Subscription.objects.filter(id=sub_id).exists(), timeout=15)
    time.sleep(0.5)
    assert consumer.received == []
    res = soap_call(
        address,
        "<wsnt:Renew><wsnt:TerminationTime>PT1H</wsnt:TerminationTime></wsnt:Renew>",
        to=address,
    )
    assert res.fault_name == "ResourceUnknownFault"


def test_a_consumer_failing_twice_is_retried_with_backoff_and_then_receives(
    platform, consumer_factory
):
    consumer = consumer_factory(fail_first=2, fail_status=503)
    _subscribe(platform, consumer.url, "ALL3")
    started = time.time()
    _notify(platform, ("ALL3", "<e:m xmlns:e='urn:t'>eventually</e:m>"))

    assert consumer.wait_for(1, timeout=30), platform.logs()
    assert consumer.payload_texts() == ["eventually"]
    statuses = [status for _t, status in consumer.posts]
    assert statuses == [503, 503, 200]
    gaps = [b[0] - a[0] for a, b in zip(consumer.posts, consumer.posts[1:], strict=False)]
    # The test platform's schedule is 0.5 s then 1 s (no jitter); a sweep runs each second.
    assert gaps[0] >= 0.5
    assert gaps[1] >= 1.0
    assert time.time() - started < 30


def test_the_publisher_does_not_wait_for_a_failing_or_dead_consumer(platform, consumer_factory):
    slow_and_dead = [consumer_factory(fail_first=10**6), None]
    for c in slow_and_dead:
        _subscribe(platform, c.url if c else "http://127.0.0.1:9/unreachable", "Object:Food:Bread")
    started = time.monotonic()
    for i in range(20):
        _notify(platform, ("Object:Food:Bread", f"<e:m xmlns:e='urn:t'>{i}</e:m>"))
    # Accepting 20 notifications takes milliseconds each, whatever the consumers do.
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    ("consumer", "reason"),
    [
        ("http://169.254.169.254/latest/meta-data/", "always refused"),
        ("http://[fe80::1]:8080/c", "always refused"),
        ("http://10.0.0.5/consumer", "outside the push allow-list"),
        ("http://192.168.1.20/consumer", "outside the push allow-list"),
    ],
)
def test_subscribing_a_refused_consumer_address_fails_with_a_clear_fault(
    platform, consumer, reason
):
    res = soap_call(platform.endpoint, subscribe_xml(consumer, "ALL"))
    assert res.status == 500
    assert res.fault_name == "SubscribeCreationFailedFault"
    assert reason in res.fault_text


def test_a_subscription_with_a_secret_gets_signed_pushes_with_stable_ids(
    platform, consumer_factory
):
    import base64
    import hashlib
    import hmac

    consumer = consumer_factory()
    policy = (
        f'<wsnt:SubscriptionPolicy><h:SigningSecret xmlns:h="{ns.HPWSN}">s3cret</h:SigningSecret>'
        "</wsnt:SubscriptionPolicy>"
    )
    body = subscribe_xml(consumer.url, "Object:Food:Fruit:Pear").replace(
        "</wsnt:Subscribe>", policy + "</wsnt:Subscribe>"
    )
    assert soap_call(platform.endpoint, body).status == 200
    _notify(platform, ("Object:Food:Fruit:Pear", "<e:m xmlns:e='urn:t'>signed</e:m>"))
    assert consumer.wait_for(1)

    got = consumer.received[0]
    headers = consumer.headers[0]
    mid, ts, sig = headers["webhook-id"], headers["webhook-timestamp"], headers["webhook-signature"]
    assert mid == got.message_id
    expected = hmac.new(b"s3cret", f"{mid}.{ts}.".encode() + got.raw, hashlib.sha256).digest()
    assert sig == "v1," + base64.b64encode(expected).decode()
    ids = etree.fromstring(got.raw).findall(f".//{{{ns.HPWSN}}}Id")
    assert len(ids) == 1
    assert ids[0].text


def test_a_message_content_filter_delivers_only_matching_messages(platform, consumer_factory):
    strict, loose = consumer_factory(), consumer_factory()
    content = (
        f'<wsnt:MessageContent Dialect="{ns.FILTER_XPATH}" xmlns:a="urn:alarm">'
        "number(//a:level) &gt; 3</wsnt:MessageContent>"
    )
    body = subscribe_xml(strict.url, "ALL:ALARM:ALARM1").replace(
        "</wsnt:Filter>", content + "</wsnt:Filter>"
    )
    assert soap_call(platform.endpoint, body).status == 200
    _subscribe(platform, loose.url, "ALL:ALARM:ALARM1")

    for level in (1, 5, 2, 9):
        _notify(
            platform,
            (
                "ALL:ALARM:ALARM1",
                f"<a:alarm xmlns:a='urn:alarm'><a:level>{level}</a:level></a:alarm>",
            ),
        )

    assert loose.wait_for(4)
    assert strict.wait_for(2)
    time.sleep(0.5)
    assert strict.payload_texts() == ["5", "9"]
    assert loose.payload_texts() == ["1", "5", "2", "9"]
