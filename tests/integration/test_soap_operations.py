"""Every WSN operation in SOAP 1.1 and 1.2, with envelopes as a zeep client builds them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
import zeep
from lxml import etree

from hpwsn import ns
from subscriptions.models import Subscription
from tests.integration.zeep_envelopes import (
    TOPIC_NS,
    WSN_OPERATIONS,
    Reply,
    WsnClient,
    schema_errors,
    wsn_client,
)
from tests.support import NSMAP

pytestmark = pytest.mark.integration

T = f"{{{ns.WSNT}}}"
TNS = {"tns": TOPIC_NS}


@pytest.fixture(params=["1.1", "1.2"])
def wsn(request, platform) -> WsnClient:  # type: ignore[no-untyped-def]
    return wsn_client(platform.endpoint, request.param)


def xsd_time(text: str | None) -> datetime:
    assert text, "no time in the response"
    return datetime.fromisoformat(text)


def assert_reply(res: Reply, version: str, body: str, *, relates_to: str | None = None) -> None:
    """A 200 answer in the version asked, whose body is wsnt:`body` and valid against b-2.xsd."""
    assert res.status == 200, res.body
    assert res.is_soap(version), (res.content_type, res.body[:300])
    assert res.body_element is not None
    assert res.body_element.tag == f"{T}{body}", res.body
    assert schema_errors(res.body_element) == []
    if relates_to is not None:
        assert res.findtext(".//wsa:RelatesTo") == relates_to


def platform_base(wsn: WsnClient) -> str:
    return wsn.endpoint.removesuffix("/wsn/")


def subscription_address(res: Reply) -> str:
    address = res.findtext(".//wsnt:SubscriptionReference/wsa:Address")
    assert address, res.body
    return address


def subscribe(wsn: WsnClient, consumer: str, topic: str | None = "ALL", **kwargs) -> str:  # type: ignore[no-untyped-def]
    res = wsn.subscribe(consumer, topic, **kwargs).post()
    assert_reply(res, wsn.version, "SubscribeResponse")
    return subscription_address(res)


def notify(wsn: WsnClient, *messages: tuple[str, str], **kwargs) -> None:  # type: ignore[no-untyped-def]
    res = wsn.notify(*messages, **kwargs).post()
    assert res.status == 202, res.body
    assert res.body == b""


def event(text: str) -> str:
    return f'<ev:event xmlns:ev="urn:hpwsn:test">{text}</ev:event>'


# ----------------------------------------------------------------------------- WSDL


def test_the_wsdl_at_query_wsdl_loads_in_zeep_with_every_operation(platform):
    client = zeep.Client(platform.endpoint + "?wsdl")

    operations = {
        name
        for service in client.wsdl.services.values()
        for port in service.ports.values()
        for name in port.binding._operations
    }
    addresses = {
        port.binding_options["address"]
        for service in client.wsdl.services.values()
        for port in service.ports.values()
    }
    assert set(WSN_OPERATIONS) <= operations
    assert addresses == {platform.endpoint}


# ----------------------------------------------------------------------------- Subscribe


def test_subscribe_answers_with_the_subscription_reference_and_its_lifetime(
    wsn, consumer_factory, db_access
):
    consumer = consumer_factory()
    env = wsn.subscribe(consumer.url, "tns:ALL", prefixes=TNS, termination="PT1H")
    before = datetime.now(UTC)

    res = env.post()

    assert_reply(res, wsn.version, "SubscribeResponse", relates_to=env.message_id)
    address = subscription_address(res)
    assert address.startswith(platform_base(wsn) + "/wsn/subscriptions/")
    sub_id = uuid.UUID(address.rstrip("/").rsplit("/", 1)[1])
    sub = Subscription.objects.get(id=sub_id)
    assert sub.consumer_address == consumer.url
    assert sub.soap_version == wsn.version
    current = xsd_time(res.findtext(".//wsnt:CurrentTime"))
    termination = xsd_time(res.findtext(".//wsnt:TerminationTime"))
    assert abs(current - before) < timedelta(seconds=30)
    assert abs(termination - (before + timedelta(hours=1))) < timedelta(seconds=30)
    assert abs(sub.termination_time - termination) < timedelta(seconds=1)


def test_subscribe_takes_an_absolute_initial_termination_time(wsn, consumer_factory):
    consumer = consumer_factory()
    when = (datetime.now(UTC) + timedelta(hours=3)).replace(microsecond=0)

    res = wsn.subscribe(consumer.url, "ALL1", termination=when).post()

    assert_reply(res, wsn.version, "SubscribeResponse")
    assert xsd_time(res.findtext(".//wsnt:TerminationTime")) == when


# Each expression, the topics it selects and the ones it does not (demo trees ALL and Object).
# The publications are colon paths, as the thesis's publishers write them.
DIALECT_CASES = {
    "simple-prefixed-root": (
        "tns:ALL",
        ns.DIALECT_SIMPLE,
        TNS,
        ["ALL", "ALL:ALARM:ALARM1"],
        ["ALL1", "Object:Tool"],
    ),
    "concrete-path": (
        "tns:ALL/ALARM",
        ns.DIALECT_CONCRETE,
        TNS,
        ["ALL:ALARM", "ALL:ALARM:ALARM1:ALARM11"],
        ["ALL", "ALL1"],
    ),
    "full-descendants": (
        "tns:ALL//*",
        ns.DIALECT_FULL,
        TNS,
        ["ALL:ALARM", "ALL:ALARM:ALARM2"],
        ["ALL", "ALL2"],
    ),
    "full-union": (
        "tns:Object/*|tns:ALL",
        ns.DIALECT_FULL,
        TNS,
        ["Object:Food:Fruit:Apple", "ALL", "Object:Tool"],
        ["Object", "ALL1"],
    ),
    "colon-path": (
        "ALL:ALARM:ALARM1",
        ns.DIALECT_SIMPLE,
        None,
        ["ALL:ALARM:ALARM1", "ALL:ALARM:ALARM1:ALARM11:ALARM111"],
        ["ALL:ALARM", "ALL:ALARM:ALARM2"],
    ),
}


@pytest.mark.parametrize("case", DIALECT_CASES)
def test_a_subscription_receives_exactly_the_topics_its_expression_selects(
    wsn, consumer_factory, case
):
    expression, dialect, prefixes, selected, others = DIALECT_CASES[case]
    consumer = consumer_factory()
    subscribe(wsn, consumer.url, expression, dialect=dialect, prefixes=prefixes)

    # Others first and a selected topic last: delivery is in order, so once the last selected
    # message has arrived, any wrongly delivered one would have arrived before it.
    published = [(topic, event(topic)) for topic in others + selected]
    notify(wsn, *published)

    assert consumer.wait_for(len(selected)), consumer.payload_texts()
    assert consumer.payload_texts() == selected
    assert [r.topic for r in consumer.received] == selected


# ----------------------------------------------------------------------------- Renew, Unsubscribe


@pytest.mark.parametrize("form", ["duration", "dateTime"])
def test_renew_on_the_subscription_address_moves_the_termination_time(
    wsn, consumer_factory, db_access, form
):
    consumer = consumer_factory()
    address = subscribe(wsn, consumer.url, "ALL2", termination="PT1H")
    wanted = (datetime.now(UTC) + timedelta(hours=5)).replace(microsecond=0)
    value = "PT5H" if form == "duration" else wanted

    env = wsn.envelope("Renew", address, TerminationTime=value)
    assert env.header.findtext("wsa:To", namespaces=NSMAP) == address
    res = env.post()

    assert_reply(res, wsn.version, "RenewResponse", relates_to=env.message_id)
    termination = xsd_time(res.findtext(".//wsnt:TerminationTime"))
    assert abs(termination - wanted) < timedelta(seconds=30)
    sub = Subscription.objects.get(id=address.rsplit("/", 1)[1])
    assert abs(sub.termination_time - termination) < timedelta(seconds=1)


def test_unsubscribe_removes_the_subscription_and_stops_delivery(wsn, consumer_factory, db_access):
    consumer = consumer_factory()
    address = subscribe(wsn, consumer.url, "ALL3")

    env = wsn.envelope("Unsubscribe", address)
    res = env.post()

    assert_reply(res, wsn.version, "UnsubscribeResponse", relates_to=env.message_id)
    assert not Subscription.objects.filter(id=address.rsplit("/", 1)[1]).exists()
    notify(wsn, ("ALL3", event("after unsubscribe")))
    assert not consumer.wait_for(1, timeout=1.0)


# ----------------------------------------------------------------------------- Pause, Resume


def test_a_paused_subscription_holds_notifications_until_it_is_resumed(wsn, consumer_factory):
    consumer = consumer_factory()
    address = subscribe(wsn, consumer.url, "ALL:ALARM:ALARM1:ALARM12")

    res = wsn.call("PauseSubscription", address)
    assert_reply(res, wsn.version, "PauseSubscriptionResponse")
    notify(wsn, ("ALL:ALARM:ALARM1:ALARM12", event("while paused")))
    assert not consumer.wait_for(1, timeout=1.5)

    res = wsn.call("ResumeSubscription", address)
    assert_reply(res, wsn.version, "ResumeSubscriptionResponse")
    assert consumer.wait_for(1)
    assert consumer.payload_texts() == ["while paused"]


# ----------------------------------------------------------------------------- Notify


def test_notify_with_several_messages_delivers_them_all_in_order(wsn, consumer_factory):
    consumer = consumer_factory()
    address = subscribe(wsn, consumer.url, "tns:ALL", prefixes=TNS)
    topics = ["tns:ALL/ALARM/ALARM1/ALARM13", "tns:ALL/ALARM/ALARM2", "tns:ALL"]

    notify(
        wsn,
        *[(topic, event(f"message {i}")) for i, topic in enumerate(topics)],
        dialect=ns.DIALECT_CONCRETE,
        prefixes=TNS,
    )

    assert consumer.wait_for(3)
    assert consumer.payload_texts() == ["message 0", "message 1", "message 2"]
    assert [r.topic for r in consumer.received] == topics
    # The publisher's namespace bindings travel with the topic, so the consumer can resolve tns.
    assert all(r.topic_nsmap.get("tns") == TOPIC_NS for r in consumer.received)
    assert {r.subscription_address for r in consumer.received} == {address}
    assert {r.soap_version for r in consumer.received} == {wsn.version}
    for raw in {r.raw for r in consumer.received}:
        pushed = etree.fromstring(raw).find(".//wsnt:Notify", NSMAP)
        assert schema_errors(pushed) == []


def test_get_current_message_returns_the_last_payload_published_on_the_topic(wsn):
    topic = "ALL:ALARM:ALARM1:ALARM14"
    notify(wsn, (topic, event(f"first {wsn.version}")))
    notify(wsn, (topic, event(f"last {wsn.version}")))

    env = wsn.envelope("GetCurrentMessage", Topic=wsn.topic(topic))
    res = env.post()

    assert_reply(res, wsn.version, "GetCurrentMessageResponse", relates_to=env.message_id)
    payload = list(res.body_element)
    assert len(payload) == 1
    assert payload[0].tag == "{urn:hpwsn:test}event"
    assert payload[0].text == f"last {wsn.version}"


# ----------------------------------------------------------------------------- pull points


def test_a_pull_point_hands_out_messages_oldest_first_until_it_is_destroyed(wsn, consumer_factory):
    topic = "ALL:ALARM:ALARM1:ALARM15"
    env = wsn.envelope("CreatePullPoint")
    res = env.post()
    assert_reply(res, wsn.version, "CreatePullPointResponse", relates_to=env.message_id)
    pull_point = res.findtext(".//wsnt:PullPoint/wsa:Address")
    assert pull_point
    assert pull_point.startswith(platform_base(wsn) + "/wsn/pullpoints/")
    subscription = subscribe(wsn, pull_point, topic)
    # A push subscriber on the same topic tells when the fan-out has filled the pull point.
    witness = consumer_factory()
    subscribe(wsn, witness.url, topic)

    for i in range(3):
        notify(wsn, (topic, event(f"pulled {i}")))
    assert witness.wait_for(3)

    env = wsn.envelope("GetMessages", pull_point, MaximumNumber=2)
    first = env.post()
    second = wsn.call("GetMessages", pull_point, MaximumNumber=2)
    third = wsn.call("GetMessages", pull_point, MaximumNumber=2)

    assert_reply(first, wsn.version, "GetMessagesResponse", relates_to=env.message_id)
    assert_reply(second, wsn.version, "GetMessagesResponse")
    assert_reply(third, wsn.version, "GetMessagesResponse")
    assert pulled_texts(first) == ["pulled 0", "pulled 1"]
    assert pulled_texts(second) == ["pulled 2"]
    assert pulled_texts(third) == []
    assert {
        m.findtext("wsnt:SubscriptionReference/wsa:Address", namespaces=NSMAP)
        for m in first.root.iterfind(".//wsnt:NotificationMessage", NSMAP)
    } == {subscription}

    res = wsn.call("DestroyPullPoint", pull_point)
    assert_reply(res, wsn.version, "DestroyPullPointResponse")
    again = wsn.call("DestroyPullPoint", pull_point)
    assert again.status == (500 if wsn.version == "1.1" else 400)
    assert again.fault_name == "UnableToDestroyPullPointFault"
    gone = wsn.call("GetMessages", pull_point, MaximumNumber=1)
    assert gone.status == (500 if wsn.version == "1.1" else 400)
    assert gone.fault_name == "ResourceUnknownFault"


def pulled_texts(res: Reply) -> list[str]:
    return [
        "".join(m.itertext())
        for m in res.root.iterfind(".//wsnt:NotificationMessage/wsnt:Message", NSMAP)
    ]


# ----------------------------------------------------------------------------- headers, dispatch


def test_a_username_token_security_header_marked_must_understand_is_accepted(
    wsn, consumer_factory, ldap_directory
):
    consumer = consumer_factory()
    password = ldap_directory.demo_password("subscriber1")
    env = wsn.subscribe(consumer.url, "ALL").add_username_token("subscriber1", password)
    security = env.header.find(f"{{{ns.WSSE}}}Security")
    assert security.get(f"{{{env.env_ns}}}mustUnderstand") == "1"

    res = env.post()

    assert_reply(res, wsn.version, "SubscribeResponse", relates_to=env.message_id)


@pytest.mark.parametrize("action", ["wrong", "missing"])
def test_the_body_element_chooses_the_operation_whatever_the_action_says(
    wsn, consumer_factory, action
):
    consumer = consumer_factory()
    env = wsn.subscribe(consumer.url, "ALL")
    unsubscribe_action = ns.action("SubscriptionManager", "Unsubscribe")
    if action == "wrong":
        env.set_wsa("Action", unsubscribe_action)
        headers = {"SOAPAction": f'"{unsubscribe_action}"'} if wsn.version == "1.1" else {}
        ct = "text/xml" if wsn.version == "1.1" else "application/soap+xml"
        action_param = "" if wsn.version == "1.1" else f'; action="{unsubscribe_action}"'
        headers["Content-Type"] = f"{ct}; charset=utf-8{action_param}"
    else:
        env.set_wsa("Action", None)
        ct = "text/xml" if wsn.version == "1.1" else "application/soap+xml"
        headers = {"Content-Type": ct}

    res = env.post(headers=headers)

    assert_reply(res, wsn.version, "SubscribeResponse", relates_to=env.message_id)
