"""RegisterPublisher, DestroyRegistration and `require_registration` through the platform."""

from __future__ import annotations

import pytest

from hpwsn import ns
from tests.support import (
    ANONYMOUS_ALLOWED,
    notify_xml,
    soap_call,
    subscribe_xml,
    topic_with_policy,
)

pytestmark = pytest.mark.integration

BR = f'xmlns:wsnbr="{ns.WSNBR}"'
SENSOR = "http://sensor-7.example/wsn"


def register(platform, publisher: str | None, *topics: str, demand: str = "") -> object:  # type: ignore[no-untyped-def]
    ref = (
        f"<wsnbr:PublisherReference><wsa:Address>{publisher}</wsa:Address>"
        "</wsnbr:PublisherReference>"
        if publisher
        else ""
    )
    names = "".join(f'<wsnbr:Topic Dialect="{ns.DIALECT_SIMPLE}">{t}</wsnbr:Topic>' for t in topics)
    extra = f"<wsnbr:Demand>{demand}</wsnbr:Demand>" if demand else ""
    return soap_call(
        platform.endpoint,
        f"<wsnbr:RegisterPublisher {BR}>{ref}{names}{extra}</wsnbr:RegisterPublisher>",
    )


def notify_from(platform, topic: str, text: str, producer: str | None):  # type: ignore[no-untyped-def]
    body = notify_xml((topic, f"<e:ev xmlns:e='urn:r'>{text}</e:ev>"))
    if producer:
        ref = (
            f"<wsnt:ProducerReference><wsa:Address>{producer}</wsa:Address>"
            "</wsnt:ProducerReference>"
        )
        body = body.replace("<wsnt:Message>", ref + "<wsnt:Message>")
    return soap_call(platform.endpoint, body)


def registration_address(res) -> str:  # type: ignore[no-untyped-def]
    found = res.root.find(f".//{{{ns.WSNBR}}}PublisherRegistrationReference/{{{ns.WSA}}}Address")
    assert found is not None, res.body
    return str(found.text)


def fault_name(res) -> str:  # type: ignore[no-untyped-def]
    detail = res.root.find(".//{*}Detail/*")
    if detail is None:
        detail = res.root.find(".//detail/*")
    return str(detail.tag.rsplit("}", 1)[-1]) if detail is not None else ""


@pytest.fixture
def gated(committed) -> str:  # type: ignore[no-untyped-def]
    committed(
        topic_with_policy,
        "Registered:Feed",
        root=ANONYMOUS_ALLOWED,  # the root's policy is inherited, and judges a registration there
        require_registration=True,
    )
    return "Registered:Feed"


def test_only_a_registered_publisher_may_publish_on_a_topic_that_requires_it(
    platform, consumer_factory, gated
):
    consumer = consumer_factory()
    assert soap_call(platform.endpoint, subscribe_xml(consumer.url, gated)).status == 200

    refused = notify_from(platform, gated, "before", SENSOR)
    assert refused.status == 500, refused.body
    assert fault_name(refused) == "PublisherRegistrationRejectedFault"
    assert SENSOR.encode() in refused.body

    res = register(platform, SENSOR, "Registered")  # a registration covers the subtree
    assert res.status == 200, res.body
    address = registration_address(res)
    assert "/wsn/registrations/" in address
    consumer_ref = res.root.find(f".//{{{ns.WSNBR}}}ConsumerReference/{{{ns.WSA}}}Address")
    assert consumer_ref is not None
    assert consumer_ref.text == platform.endpoint

    assert notify_from(platform, gated, "registered", SENSOR).status == 202
    anonymous = notify_from(platform, gated, "anonymous", None)
    assert fault_name(anonymous) == "PublisherRegistrationRejectedFault"
    other = notify_from(platform, gated, "other", "http://sensor-8.example/wsn")
    assert fault_name(other) == "PublisherRegistrationRejectedFault"
    assert consumer.wait_for(1), platform.logs()

    gone = soap_call(address, f"<wsnbr:DestroyRegistration {BR}/>")
    assert gone.status == 200, gone.body
    assert gone.root.find(f".//{{{ns.WSNBR}}}DestroyRegistrationResponse") is not None
    after = notify_from(platform, gated, "after", SENSOR)
    assert fault_name(after) == "PublisherRegistrationRejectedFault"
    again = soap_call(address, f"<wsnbr:DestroyRegistration {BR}/>")
    assert fault_name(again) == "ResourceUnknownFault"

    assert consumer.payload_texts() == ["registered"]


def test_a_registration_for_another_topic_does_not_open_this_one(platform, gated):
    assert register(platform, SENSOR, "ALL:ALARM").status == 200
    res = notify_from(platform, gated, "x", SENSOR)
    assert fault_name(res) == "PublisherRegistrationRejectedFault"


def test_topics_without_the_policy_accept_unregistered_publishers(platform):
    res = notify_from(platform, "ALL:ALARM:ALARM1", "free", "http://anyone.example/")
    assert res.status == 202, res.body


def test_demand_based_publishing_is_refused_with_a_fault_that_says_so(platform):
    res = register(platform, SENSOR, "ALL", demand="true")
    assert fault_name(res) == "PublisherRegistrationRejectedFault"
    assert b"demand-based" in res.body


def test_a_registration_needs_a_publisher_reference(platform):
    res = register(platform, None, "ALL")
    assert fault_name(res) == "PublisherRegistrationRejectedFault"
    assert b"PublisherReference" in res.body


def test_a_registration_for_an_unknown_topic_is_a_topic_not_supported_fault(platform):
    res = register(platform, SENSOR, "ALL:NoSuchTopic")
    assert fault_name(res) == "TopicNotSupportedFault"


def test_a_registration_with_a_bad_demand_is_a_client_fault(platform):
    res = register(platform, SENSOR, "ALL", demand="maybe")
    assert res.status == 500
    assert b"xsd:boolean" in res.body
