"""End to end: SOAP over HTTP into the web server, real Celery workers on Redis, real consumers."""

from __future__ import annotations

import time

import pytest

from hpwsn import ns
from hpwsn_site import state
from tests.support import NSMAP, notify_xml, soap_call, subscribe_xml, wait_until

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
    assert got.message_id and got.message_id.startswith("urn:uuid:")
    assert got.soap_version == "1.1"
