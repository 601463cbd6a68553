"""Topic policies that act on the publish path: auto-create of children, time-to-live."""

from __future__ import annotations

import time

import pytest

from tests.support import (
    ANONYMOUS_ALLOWED,
    notify_xml,
    soap_call,
    subscribe_xml,
    topic_with_policy,
    wait_until,
)

pytestmark = pytest.mark.integration


def _set_policy(committed, path: str, **fields: object) -> None:  # type: ignore[no-untyped-def]
    # A new root refuses anonymous callers unless its policy allows them.
    committed(topic_with_policy, path, **ANONYMOUS_ALLOWED, **fields)


def test_publishing_under_a_topic_that_allows_auto_create_creates_the_child(
    platform, consumer_factory, committed
):
    from topics.models import Topic

    _set_policy(committed, "Sensors", auto_create_children=True)
    consumer = consumer_factory()
    assert soap_call(platform.endpoint, subscribe_xml(consumer.url, "Sensors")).status == 200

    res = soap_call(
        platform.endpoint, notify_xml(("Sensors:Room7:Temp", "<t xmlns='urn:t'>21</t>"))
    )

    assert res.status == 202, res.body
    assert Topic.objects.filter(path="Sensors:Room7:Temp").exists()
    assert Topic.objects.filter(path="Sensors:Room7").exists()
    assert consumer.wait_for(1)
    assert consumer.received[0].topic == "Sensors:Room7:Temp"


def test_publishing_to_an_unknown_child_without_auto_create_is_refused(platform, db_access):
    from topics.models import Topic

    res = soap_call(platform.endpoint, notify_xml(("ALL:ALARM:Nope", "<t xmlns='urn:t'>x</t>")))

    assert res.fault_name == "TopicNotSupportedFault"
    assert "ALL:ALARM:Nope" in res.fault_text
    assert not Topic.objects.filter(path="ALL:ALARM:Nope").exists()


def test_a_message_past_its_time_to_live_is_not_delivered_and_counts_as_expired(
    platform, consumer_factory, committed
):
    _set_policy(committed, "Ephemeral", ttl_seconds=1)
    consumer = consumer_factory()
    res = soap_call(platform.endpoint, subscribe_xml(consumer.url, "Ephemeral"))
    address = res.findtext(".//wsnt:SubscriptionReference/wsa:Address")
    assert soap_call(address, "<wsnt:PauseSubscription/>", to=address).status == 200
    r = platform.redis()
    expired_before = int(r.hget("hpwsn:stats", "expired") or 0)

    soap_call(platform.endpoint, notify_xml(("Ephemeral", "<t xmlns='urn:t'>stale</t>")))
    time.sleep(1.6)
    assert soap_call(address, "<wsnt:ResumeSubscription/>", to=address).status == 200
    soap_call(platform.endpoint, notify_xml(("Ephemeral", "<t xmlns='urn:t'>fresh</t>")))

    assert consumer.wait_for(1)
    assert wait_until(lambda: int(r.hget("hpwsn:stats", "expired") or 0) > expired_before)
    assert consumer.payload_texts() == ["fresh"]


def test_a_publisher_refused_under_an_auto_create_topic_creates_nothing(
    platform, committed, db_access
):
    from topics.models import Topic

    committed(topic_with_policy, "Gated", auto_create_children=True)

    res = soap_call(platform.endpoint, notify_xml(("Gated:New", "<t xmlns='urn:t'>x</t>")))

    assert "NotAuthorized" in res.body.decode()
    assert "Gated:New" in res.fault_text
    assert not Topic.objects.filter(path="Gated:New").exists()
