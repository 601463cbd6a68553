"""The thesis's `String WsnProcess(String)` interface: WsnProcess bodies on /wsn/ and Spyne's RPC.

The envelopes are those of figures 4-9 and 5-1..5-4 (namespace http://org.apache.servicemix.application).
"""

from __future__ import annotations

import uuid
from xml.sax.saxutils import escape

import httpx
import pytest
import zeep
from lxml import etree

from hpwsn import ns
from subscriptions.models import Subscription
from tests.integration.zeep_envelopes import Reply, reply_of, wsn_client
from tests.support import topic_with_policy

pytestmark = pytest.mark.integration

T = f"{{{ns.WSNT}}}"
WSNT_DECL = f'xmlns:wsnt="{ns.WSNT}"'


def wsn_process(platform, inner_xml: str, *, to: str | None = None) -> Reply:  # type: ignore[no-untyped-def]
    """POST the thesis's envelope: soapenv + org:WsnProcess around one WSN element."""
    header = f'<wsa:To xmlns:wsa="{ns.WSA}">{to}</wsa:To>' if to else ""
    data = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/"\n'
        '    xmlns:org="http://org.apache.servicemix.application">\n'
        f"<soapenv:Header>{header}</soapenv:Header>\n"
        f"<soapenv:Body>\n<org:WsnProcess>\n{inner_xml}\n</org:WsnProcess>\n</soapenv:Body>\n"
        "</soapenv:Envelope>"
    )
    resp = httpx.post(
        platform.endpoint,
        content=data.encode(),
        headers={"Content-Type": "text/xml; charset=UTF-8", "SOAPAction": '""'},
        timeout=30,
    )
    return reply_of(resp)


def returned_text(res: Reply) -> str:
    assert res.status == 200, res.body
    assert res.is_soap("1.1")
    text = res.findtext(f".//{{{ns.LEGACY}}}WsnProcessResponse/return")
    assert text is not None, res.body
    return text


def returned_element(text: str) -> etree._Element:
    return etree.fromstring(text.encode())


def create_pull_point(platform) -> str:  # type: ignore[no-untyped-def]
    """Figure 5-1: a push endpoint for the coming subscription."""
    res = wsn_process(platform, f"<wsnt:CreatePullPoint {WSNT_DECL}/>")
    response = returned_element(returned_text(res))
    assert response.tag == f"{T}CreatePullPointResponse"
    address = response.findtext(f"{T}PullPoint/{{{ns.WSA}}}Address")
    assert address
    return address


def legacy_subscribe_xml(push_endpoint: str, topic: str, subscriber: str) -> str:
    """Figure 5-2: the push endpoint as ConsumerReference, the real target as SubscriberAddress."""
    return (
        f'<wsnt:Subscribe {WSNT_DECL} xmlns:wsa="{ns.WSA}">\n'
        f"<wsnt:ConsumerReference>\n<wsa:Address>\n{push_endpoint}\n</wsa:Address>\n"
        "</wsnt:ConsumerReference>\n"
        f'<wsnt:Filter>\n<wsnt:TopicExpression Dialect="{ns.DIALECT_SIMPLE}">\n{topic}\n'
        "</wsnt:TopicExpression>\n</wsnt:Filter>\n"
        f"<wsnt:SubscriberAddress>\n{subscriber}\n</wsnt:SubscriberAddress>\n"
        "</wsnt:Subscribe>"
    )


def subscribe(platform, push_endpoint: str, topic: str, subscriber: str) -> str:  # type: ignore[no-untyped-def]
    res = wsn_process(platform, legacy_subscribe_xml(push_endpoint, topic, subscriber))
    response = returned_element(returned_text(res))
    assert response.tag == f"{T}SubscribeResponse"
    address = response.findtext(f"{T}SubscriptionReference/{{{ns.WSA}}}Address")
    assert address
    return address


def notification_message_xml(topic: str, text: str) -> str:
    """Figure 5-4: a bare NotificationMessage with the fragmentation header of a whole message."""
    return (
        f"<wsnt:NotificationMessage {WSNT_DECL}>\n"
        f'<wsnt:Topic Dialect="{ns.DIALECT_SIMPLE}">\n{topic}\n</wsnt:Topic>\n'
        "<wsnt:Package>\n<Identification>\n1235324366.344\n</Identification>\n"
        "<Fragment>0-0-1-0</Fragment>\n</wsnt:Package>\n"
        f"<wsnt:Message>\n<data>{text}</data>\n</wsnt:Message>\n"
        "</wsnt:NotificationMessage>"
    )


def destroy_pull_point(platform, address: str) -> Reply:  # type: ignore[no-untyped-def]
    return wsn_process(platform, f"<wsnt:DestroyPullPoint {WSNT_DECL}/>", to=address)


# ----------------------------------------------------------------------------- WsnProcess on /wsn/


def test_create_pull_point_in_wsn_process_returns_the_response_as_an_escaped_string(platform):
    res = wsn_process(platform, f"<wsnt:CreatePullPoint {WSNT_DECL}/>")

    text = returned_text(res)
    assert text.startswith("<wsnt:CreatePullPointResponse")
    assert b"&lt;wsnt:CreatePullPointResponse" in res.body  # escaped, not a child element
    address = returned_element(text).findtext(f"{T}PullPoint/{{{ns.WSA}}}Address")
    assert address.startswith(platform.endpoint + "pullpoints/")


def test_the_returned_string_is_a_namespace_well_formed_xml_document(platform):
    res = wsn_process(platform, f"<wsnt:CreatePullPoint {WSNT_DECL}/>")

    response = etree.fromstring(returned_text(res).encode())

    assert response.tag == f"{T}CreatePullPointResponse"


def test_a_legacy_subscription_pushes_to_the_subscriber_address(
    platform, consumer_factory, db_access
):
    consumer = consumer_factory()
    push_endpoint = create_pull_point(platform)
    address = subscribe(platform, push_endpoint, "ALL:ALARM", consumer.url)

    sub = Subscription.objects.get(id=address.rsplit("/", 1)[1])
    assert sub.consumer_address == consumer.url
    res = wsn_process(platform, notification_message_xml("ALL:ALARM:ALARM1", "notification"))

    assert returned_text(res) == "accepted"
    assert consumer.wait_for(1)
    got = consumer.received[0]
    assert consumer.payload_texts() == ["notification"]
    assert got.to == consumer.url
    assert got.topic == "ALL:ALARM:ALARM1"
    assert got.subscription_address == address
    # A whole message (Fragment 0-0-1-0) is delivered without its fragmentation header.
    assert b"Package" not in got.raw
    assert b"Identification" not in got.raw


def test_a_duplicate_legacy_subscribe_returns_the_same_subscription_and_frees_its_endpoint(
    platform, consumer_factory
):
    consumer = consumer_factory()
    first = subscribe(platform, create_pull_point(platform), "ALL:ALARM:ALARM2", consumer.url)
    second_endpoint = create_pull_point(platform)

    second = subscribe(platform, second_endpoint, "ALL:ALARM:ALARM2", consumer.url)

    assert second == first
    # Thesis figure 5-9: the push endpoint created for the duplicate is released.
    released = destroy_pull_point(platform, second_endpoint)
    assert released.fault_name == "UnableToDestroyPullPointFault"
    wsn_process(platform, notification_message_xml("ALL:ALARM:ALARM2", "once"))
    assert consumer.wait_for(1)
    assert not consumer.wait_for(2, timeout=1.0)
    assert consumer.payload_texts() == ["once"]


def test_an_identical_legacy_subscribe_sent_again_keeps_answering_the_same_subscription(
    platform, consumer_factory
):
    consumer = consumer_factory()
    envelope = legacy_subscribe_xml(create_pull_point(platform), "Object:Tool", consumer.url)

    replies = [wsn_process(platform, envelope) for _ in range(3)]

    addresses = {
        returned_element(returned_text(r)).findtext(f".//{{{ns.WSA}}}Address") for r in replies
    }
    assert len(addresses) == 1


def test_unsubscribe_with_the_subscription_address_in_wsa_to_stops_pushes(
    platform, consumer_factory
):
    consumer = consumer_factory()
    push_endpoint = create_pull_point(platform)
    address = subscribe(platform, push_endpoint, "Object:Food", consumer.url)

    # Figure 5-3: the body names nothing; wsa:To says which subscription goes.
    res = wsn_process(platform, f"<wsnt:Unsubscribe {WSNT_DECL}/>", to=address)

    assert returned_element(returned_text(res)).tag == f"{T}UnsubscribeResponse"
    wsn_process(platform, notification_message_xml("Object:Food:Bread", "too late"))
    assert not consumer.wait_for(1, timeout=1.0)
    # The push endpoint bound to the subscription went with it.
    assert destroy_pull_point(platform, push_endpoint).fault_name == "UnableToDestroyPullPointFault"


def test_a_fault_inside_wsn_process_names_the_wsn_fault(platform):
    res = wsn_process(platform, notification_message_xml("NOWHERE", "lost"))

    assert res.status == 500
    assert res.fault_name == "TopicNotSupportedFault"
    assert "NOWHERE" in res.fault_text


# ----------------------------------------------------------------------------- Spyne /wsn/legacy/


@pytest.fixture
def legacy_client(platform) -> zeep.Client:  # type: ignore[no-untyped-def]
    return zeep.Client(platform.base_url + "/wsn/legacy/?wsdl")


def test_the_legacy_wsdl_loads_in_zeep_with_the_wsn_process_operation(platform, legacy_client):
    ports = [p for s in legacy_client.wsdl.services.values() for p in s.ports.values()]

    assert [list(p.binding._operations) for p in ports] == [["WsnProcess"]]
    assert ports[0].binding_options["address"] == platform.base_url + "/wsn/legacy/"


def test_spyne_wsn_process_creates_a_pull_point(platform, legacy_client):
    result = legacy_client.service.WsnProcess(message=f"<wsnt:CreatePullPoint {WSNT_DECL}/>")

    response = returned_element(result)
    assert response.tag == f"{T}CreatePullPointResponse"
    address = response.findtext(f"{T}PullPoint/{{{ns.WSA}}}Address")
    assert address.startswith(platform.endpoint + "pullpoints/")
    # The pull point is real: the SOAP 1.1 interface can drain it.
    res = wsn_client(platform.endpoint, "1.1").call("GetMessages", address, MaximumNumber=1)
    assert res.status == 200
    assert res.body_element.tag == f"{T}GetMessagesResponse"


def test_spyne_wsn_process_publishes_a_notification_message(
    platform, legacy_client, consumer_factory
):
    consumer = consumer_factory()
    subscribe(platform, create_pull_point(platform), "ALL:ALARM:ALARM1:ALARM11", consumer.url)

    result = legacy_client.service.WsnProcess(
        message=notification_message_xml("ALL:ALARM:ALARM1:ALARM11:ALARM111", "via spyne")
    )

    assert result == "accepted"
    assert consumer.wait_for(1)
    assert consumer.payload_texts() == ["via spyne"]
    assert consumer.received[0].topic == "ALL:ALARM:ALARM1:ALARM11:ALARM111"


def test_spyne_wsn_process_answers_a_bad_message_with_a_client_fault(legacy_client):
    with pytest.raises(zeep.exceptions.Fault) as fault:
        legacy_client.service.WsnProcess(message=notification_message_xml("NOWHERE", "lost"))

    assert fault.value.code.endswith("Client")
    assert "NOWHERE" in fault.value.message


# ----------------------------------------------------------------------------- hostile input


def spyne_envelope(message_xml: str, *, prolog: str = "") -> bytes:
    return (
        f'<?xml version="1.0"?>{prolog}<soapenv:Envelope '
        f'xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/" xmlns:org="{ns.LEGACY}">'
        f"<soapenv:Body><org:WsnProcess><org:message>{message_xml}</org:message></org:WsnProcess>"
        "</soapenv:Body></soapenv:Envelope>"
    ).encode()


def post_legacy(platform, data: bytes) -> Reply:  # type: ignore[no-untyped-def]
    resp = httpx.post(
        platform.base_url + "/wsn/legacy/",
        content=data,
        headers={"Content-Type": "text/xml; charset=utf-8"},
        timeout=60,
    )
    return reply_of(resp)


def xxe_request(tmp_path) -> tuple[bytes, str]:  # type: ignore[no-untyped-def]
    secret = tmp_path / "secret.txt"
    marker = f"top-secret-{uuid.uuid4()}"
    secret.write_text(marker)
    escaped = escape(notification_message_xml("ALL", "x")).replace("ALL", "&xxe;", 1)
    prolog = f'<!DOCTYPE soapenv:Envelope [<!ENTITY xxe SYSTEM "{secret.as_uri()}">]>'
    return spyne_envelope(escaped, prolog=prolog), marker


BOMB_PROLOG = (
    "<!DOCTYPE soapenv:Envelope ["
    + '<!ENTITY a0 "lol">'
    + "".join(f'<!ENTITY a{i} "{f"&a{i - 1};" * 10}">' for i in range(1, 10))
    + "]>"
)


def test_the_legacy_endpoint_never_reads_an_external_entity(platform, legacy_client, tmp_path):
    data, marker = xxe_request(tmp_path)

    res = post_legacy(platform, data)

    assert res.status >= 400
    assert marker.encode() not in res.body
    assert legacy_client.service.WsnProcess(message=f"<wsnt:CreatePullPoint {WSNT_DECL}/>")


@pytest.mark.parametrize(
    "attack",
    [
        "external-entity",
        "entity-bomb",
        "oversized",
    ],
)
def test_the_legacy_endpoint_refuses_hostile_input_with_a_soap_client_fault(
    platform, tmp_path, attack
):
    if attack == "external-entity":
        data = xxe_request(tmp_path)[0]
    elif attack == "entity-bomb":
        data = spyne_envelope("&a9;", prolog=BOMB_PROLOG)
    else:
        data = spyne_envelope("a" * (11 * 1024 * 1024))

    res = post_legacy(platform, data)

    assert res.is_soap("1.1"), (res.status, res.content_type, res.body[:200])
    assert res.fault_code is not None
    assert res.fault_code.startswith("Client")
    assert b"lollol" not in res.body


def test_the_spyne_endpoint_authenticates_callers_like_the_wsn_endpoint(
    platform, committed, ldap_directory
):
    committed(topic_with_policy, "LegacyClosed", anonymous_publish=False)  # admins only
    data = spyne_envelope(escape(notification_message_xml("LegacyClosed", "x")))

    anonymous = post_legacy(platform, data)
    admin = httpx.post(
        platform.base_url + "/wsn/legacy/",
        content=data,
        headers={"Content-Type": "text/xml; charset=utf-8"},
        auth=("admin1", ldap_directory.demo_password("admin1")),
        timeout=60,
    )

    assert anonymous.status == 500
    assert "anonymous caller may not publish on topic 'LegacyClosed'" in anonymous.body.decode()
    assert admin.status_code == 200, admin.text
    assert ">accepted<" in admin.text
