"""Every fault the /wsn/ endpoint answers, in SOAP 1.1 and 1.2, fed with bad input."""

from __future__ import annotations

import uuid

import httpx
import pytest
from lxml import etree

from hpwsn import ns
from subscriptions.models import Subscription
from tests.integration.zeep_envelopes import (
    ENVELOPE_NS,
    TOPIC_NS,
    Reply,
    WsnClient,
    reply_of,
    schema_errors,
    wsn_client,
)

pytestmark = pytest.mark.integration

T = f"{{{ns.WSNT}}}"
CONTENT_TYPE = {"1.1": "text/xml; charset=utf-8", "1.2": "application/soap+xml; charset=utf-8"}
UNKNOWN_ID = "0b1d6f0e-5d1c-4c41-9a56-000000000000"


@pytest.fixture(params=["1.1", "1.2"])
def wsn(request, platform) -> WsnClient:  # type: ignore[no-untyped-def]
    return wsn_client(platform.endpoint, request.param)


def assert_fault(
    res: Reply,
    version: str,
    *,
    mentions: str,
    wsn_fault: str | None = None,
    code: str = "Sender",
    status: int | None = None,
) -> None:
    """A SOAP fault in the version spoken, with the SOAP code, WSN detail and a telling message."""
    soap11_code = {"Sender": "Client", "Receiver": "Server"}.get(code, code)
    if status is None:
        status = 400 if version == "1.2" and code == "Sender" else 500
    assert res.status == status, res.body
    assert res.is_soap(version), (res.content_type, res.body[:300])
    assert res.fault_code == (soap11_code if version == "1.1" else code), res.body
    assert res.fault_name == wsn_fault, res.body
    assert mentions.lower() in res.fault_text.lower(), res.fault_text
    if wsn_fault is not None and version == "1.2":
        subcode = res.findtext(".//s12:Code/s12:Subcode/s12:Value")
        assert subcode is not None
        assert subcode.endswith(f":{wsn_fault}")


def post_raw(wsn: WsnClient, data: bytes, url: str | None = None) -> Reply:
    resp = httpx.post(
        url or wsn.endpoint,
        content=data,
        headers={"Content-Type": CONTENT_TYPE[wsn.version]},
        timeout=60,
    )
    return reply_of(resp)


def envelope_around(wsn: WsnClient, body_xml: str, *, prolog: str = "") -> bytes:
    return (
        f'{prolog}<s:Envelope xmlns:s="{ENVELOPE_NS[wsn.version]}"><s:Body>{body_xml}</s:Body>'
        "</s:Envelope>"
    ).encode()


def notify_is_delivered_afterwards(wsn: WsnClient, consumer_factory, topic: str) -> None:  # type: ignore[no-untyped-def]
    consumer = consumer_factory()
    res = wsn.subscribe(consumer.url, topic).post()
    assert res.status == 200, res.body
    assert wsn.notify((topic, "<ok>still serving</ok>")).post().status == 202
    assert consumer.wait_for(1)
    assert consumer.payload_texts() == ["still serving"]


# ----------------------------------------------------------------------------- refused documents


def test_malformed_xml_is_a_sender_fault(wsn):
    data = wsn.subscribe("http://127.0.0.1:9/c", "ALL").to_bytes()
    res = post_raw(wsn, data[: len(data) // 2])
    assert_fault(res, wsn.version, mentions="malformed XML")


def test_a_body_that_is_not_a_wsn_message_is_a_sender_fault(wsn):
    env = wsn.envelope("CreatePullPoint")
    body = env.body.getparent()
    body.replace(env.body, etree.Element("{urn:example:billing}Invoice"))
    res = env.post()
    assert_fault(res, wsn.version, mentions="{urn:example:billing}Invoice")


def test_a_document_that_is_not_a_soap_envelope_is_a_sender_fault(wsn):
    env = wsn.envelope("CreatePullPoint")
    res = post_raw(wsn, etree.tostring(env.body))
    assert_fault(res, wsn.version, mentions="not a SOAP 1.1 or 1.2 Envelope")


def test_an_entity_expansion_bomb_is_refused_unexpanded(wsn):
    entities = '<!ENTITY lol0 "lol">' + "".join(
        f'<!ENTITY lol{i} "{f"&lol{i - 1};" * 10}">' for i in range(1, 10)
    )
    body = (
        f'<wsnt:GetCurrentMessage xmlns:wsnt="{ns.WSNT}"><wsnt:Topic Dialect="'
        f'{ns.DIALECT_SIMPLE}">&lol9;</wsnt:Topic></wsnt:GetCurrentMessage>'
    )
    data = envelope_around(wsn, body, prolog=f"<!DOCTYPE s:Envelope [{entities}]>")

    res = post_raw(wsn, data)

    assert_fault(res, wsn.version, mentions="DTD")
    assert len(res.body) < 5000
    assert b"lollol" not in res.body


def test_an_external_entity_is_refused_and_the_file_never_read(wsn, tmp_path):
    secret = tmp_path / "secret.txt"
    marker = f"top-secret-{uuid.uuid4()}"
    secret.write_text(marker)
    body = (
        f'<wsnt:GetCurrentMessage xmlns:wsnt="{ns.WSNT}"><wsnt:Topic Dialect="'
        f'{ns.DIALECT_SIMPLE}">&xxe;</wsnt:Topic></wsnt:GetCurrentMessage>'
    )
    prolog = f'<!DOCTYPE s:Envelope [<!ENTITY xxe SYSTEM "{secret.as_uri()}">]>'

    res = post_raw(wsn, envelope_around(wsn, body, prolog=prolog))

    assert_fault(res, wsn.version, mentions="DTD")
    assert marker.encode() not in res.body


def test_nesting_deeper_than_64_levels_is_refused(wsn):
    payload = "<a>" * 70 + "deep" + "</a>" * 70
    res = wsn.notify(("ALL", payload)).post()
    assert_fault(res, wsn.version, mentions="nesting exceeds the limit of 64")


def test_an_oversized_body_gets_413_and_the_server_keeps_serving(wsn, consumer_factory, platform):
    data = envelope_around(wsn, "<x>" + "a" * (11 * 1024 * 1024) + "</x>")

    res = post_raw(wsn, data)

    assert_fault(res, wsn.version, mentions="exceeds the limit", status=413)
    # The web still answers and reaches its database and Redis. (Whether every worker's
    # heartbeat is on time, which /healthz also reports, says nothing about the web.)
    health = httpx.get(platform.base_url + "/healthz", timeout=10)
    assert health.status_code == 200, health.text
    checks = health.json()["checks"]
    assert (checks["database"]["status"], checks["redis"]["status"]) == ("ok", "ok"), checks
    notify_is_delivered_afterwards(wsn, consumer_factory, "ALL:ALARM:ALARM1:ALARM11:ALARM112")


def test_an_oversized_chunked_body_gets_413_too(wsn):
    def chunks():  # no Content-Length: the size is only known while reading
        yield f'<s:Envelope xmlns:s="{ENVELOPE_NS[wsn.version]}"><s:Body><x>'.encode()
        for _ in range(11):
            yield b"a" * (1024 * 1024)
        yield b"</x></s:Body></s:Envelope>"

    resp = httpx.post(
        wsn.endpoint,
        content=chunks(),
        headers={"Content-Type": CONTENT_TYPE[wsn.version]},
        timeout=60,
    )

    assert_fault(reply_of(resp), wsn.version, mentions="exceeds the limit", status=413)


# ----------------------------------------------------------------------------- topic expressions


INVALID_EXPRESSIONS = {
    "empty-last-step": ("ALL//", ns.DIALECT_FULL, "ends with '/'"),
    "space-in-name": ("a b", ns.DIALECT_SIMPLE, "not a valid topic name"),
    "undeclared-prefix": ("foo:ALL/ALARM", ns.DIALECT_CONCRETE, "prefix 'foo'"),
}


def topic_request(wsn: WsnClient, operation: str, topic: str, dialect: str, prefixes=None):  # type: ignore[no-untyped-def]
    if operation == "Subscribe":
        return wsn.subscribe("http://127.0.0.1:9/never", topic, dialect=dialect, prefixes=prefixes)
    if operation == "Notify":
        return wsn.notify((topic, "<x/>"), dialect=dialect, prefixes=prefixes)
    env = wsn.envelope("GetCurrentMessage", Topic=wsn.topic(topic, dialect))
    return env.declare("Topic", prefixes) if prefixes else env


@pytest.mark.parametrize("operation", ["Subscribe", "Notify"])
@pytest.mark.parametrize("case", INVALID_EXPRESSIONS)
def test_an_invalid_topic_expression_is_an_invalid_topic_expression_fault(wsn, operation, case):
    expression, dialect, mentions = INVALID_EXPRESSIONS[case]
    res = topic_request(wsn, operation, expression, dialect).post()
    assert_fault(res, wsn.version, wsn_fault="InvalidTopicExpressionFault", mentions=mentions)


@pytest.mark.parametrize("operation", ["Subscribe", "Notify", "GetCurrentMessage"])
def test_an_unknown_dialect_is_a_topic_expression_dialect_unknown_fault(wsn, operation):
    res = topic_request(wsn, operation, "ALL", "urn:example:xpath-ish").post()
    assert_fault(
        res,
        wsn.version,
        wsn_fault="TopicExpressionDialectUnknownFault",
        mentions="urn:example:xpath-ish",
    )


@pytest.mark.parametrize("operation", ["Subscribe", "Notify", "GetCurrentMessage"])
@pytest.mark.parametrize(
    ("topic", "dialect", "prefixes"),
    [
        ("NOWHERE", ns.DIALECT_SIMPLE, None),
        ("tns:ALL/ALARM/NOWHERE", ns.DIALECT_CONCRETE, {"tns": TOPIC_NS}),
    ],
    ids=["root", "child"],
)
def test_a_topic_outside_the_tree_is_a_topic_not_supported_fault(
    wsn, operation, topic, dialect, prefixes
):
    res = topic_request(wsn, operation, topic, dialect, prefixes).post()
    assert_fault(res, wsn.version, wsn_fault="TopicNotSupportedFault", mentions=topic)


# ----------------------------------------------------------------------------- termination times


@pytest.mark.parametrize(
    ("value", "mentions"),
    [
        ("2001-01-01T00:00:00Z", "not in the future"),
        ("-PT1H", "not in the future"),
        ("next tuesday", "next tuesday"),
    ],
    ids=["past-datetime", "negative-duration", "unparsable"],
)
def test_a_bad_initial_termination_time_is_refused(wsn, value, mentions):
    res = wsn.subscribe("http://127.0.0.1:9/never", "ALL", termination=value).post()
    assert_fault(
        res, wsn.version, wsn_fault="UnacceptableInitialTerminationTimeFault", mentions=mentions
    )


@pytest.mark.parametrize(
    ("value", "mentions"),
    [("2001-01-01T00:00:00Z", "not in the future"), ("next tuesday", "next tuesday")],
    ids=["past-datetime", "unparsable"],
)
def test_a_bad_renew_termination_time_is_refused_and_the_lifetime_kept(
    wsn, consumer_factory, db_access, value, mentions
):
    consumer = consumer_factory()
    res = wsn.subscribe(consumer.url, "ALL1", termination="PT1H").post()
    address = res.findtext(".//wsnt:SubscriptionReference/wsa:Address")
    sub_id = address.rsplit("/", 1)[1]
    termination = Subscription.objects.get(id=sub_id).termination_time

    res = wsn.call("Renew", address, TerminationTime=value)

    assert_fault(res, wsn.version, wsn_fault="UnacceptableTerminationTimeFault", mentions=mentions)
    assert Subscription.objects.get(id=sub_id).termination_time == termination


# ----------------------------------------------------------------------------- unknown resources


@pytest.mark.parametrize(
    ("operation", "kind"),
    [
        ("Renew", "subscriptions"),
        ("Unsubscribe", "subscriptions"),
        ("PauseSubscription", "subscriptions"),
        ("ResumeSubscription", "subscriptions"),
        ("GetMessages", "pullpoints"),
        ("DestroyPullPoint", "pullpoints"),
    ],
)
def test_an_unknown_resource_is_a_resource_unknown_fault(wsn, operation, kind):
    address = f"{wsn.endpoint}{kind}/{UNKNOWN_ID}"
    params = {"TerminationTime": "PT1H"} if operation == "Renew" else {}
    res = wsn.call(operation, address, **params)
    assert_fault(res, wsn.version, wsn_fault="ResourceUnknownFault", mentions=UNKNOWN_ID)
    assert res.root.find(f".//{{{ns.WSRF_R}}}ResourceUnknownFault") is not None


def test_a_subscription_request_without_a_resource_address_is_a_resource_unknown_fault(wsn):
    env = wsn.envelope("Unsubscribe").set_wsa("To", None)
    res = env.post()
    assert_fault(res, wsn.version, wsn_fault="ResourceUnknownFault", mentions="wsa:To")


def test_subscribing_an_unknown_pull_point_is_a_resource_unknown_fault(wsn):
    res = wsn.subscribe(f"{wsn.endpoint}pullpoints/{UNKNOWN_ID}", "ALL").post()
    assert_fault(res, wsn.version, wsn_fault="ResourceUnknownFault", mentions=UNKNOWN_ID)


def test_an_address_with_a_malformed_id_is_a_resource_unknown_fault(wsn):
    address = f"{wsn.endpoint}subscriptions/no-such-subscription"
    res = wsn.call("Unsubscribe", address)
    assert_fault(res, wsn.version, wsn_fault="ResourceUnknownFault", mentions="no-such")


# ----------------------------------------------------------------------------- filters


def subscribe_with_filter(wsn: WsnClient, element: etree._Element) -> Reply:
    env = wsn.subscribe("http://127.0.0.1:9/never", "ALL")
    env.body.find(f"{T}Filter").append(element)
    return env.post()


def test_an_unknown_filter_element_is_an_invalid_filter_fault(wsn):
    element = etree.Element("{urn:example:filters}ProducerProperties")
    element.text = "boolean(//x)"
    res = subscribe_with_filter(wsn, element)
    assert_fault(res, wsn.version, wsn_fault="InvalidFilterFault", mentions="ProducerProperties")


def test_an_unknown_filter_in_a_namespace_with_markup_characters_is_a_fault_that_parses(wsn):
    # The namespace went into the fault's UnknownFilter unescaped: `&` made the fault malformed
    # XML, which a client could not read as a fault.
    element = etree.Element("{urn:a&b}Custom")
    res = subscribe_with_filter(wsn, element)
    assert_fault(res, wsn.version, wsn_fault="InvalidFilterFault", mentions="Custom")


def test_an_unknown_message_content_dialect_is_an_invalid_filter_fault(wsn):
    element = etree.Element(f"{T}MessageContent", Dialect="urn:example:jsonpath")
    element.text = "$.x"
    res = subscribe_with_filter(wsn, element)
    assert_fault(res, wsn.version, wsn_fault="InvalidFilterFault", mentions="urn:example:jsonpath")


def test_a_bad_xpath_is_an_invalid_message_content_expression_fault(wsn):
    element = etree.Element(f"{T}MessageContent", Dialect=ns.FILTER_XPATH)
    element.text = "//ev:event[["
    res = subscribe_with_filter(wsn, element)
    assert_fault(
        res, wsn.version, wsn_fault="InvalidMessageContentExpressionFault", mentions="//ev:event[["
    )


# ----------------------------------------------------------------------------- other faults


def test_get_current_message_on_a_topic_never_published_is_a_no_current_message_fault(wsn):
    topic = "ALL:ALARM:ALARM1:ALARM11:ALARM115"  # no test publishes here
    res = wsn.call("GetCurrentMessage", Topic=wsn.topic(topic))
    assert_fault(res, wsn.version, wsn_fault="NoCurrentMessageOnTopicFault", mentions=topic)


def test_an_unknown_header_marked_must_understand_is_a_must_understand_fault(wsn):
    env = wsn.envelope("CreatePullPoint")
    env.add_header(
        f'<tx:Transaction xmlns:tx="urn:example:tx" xmlns:s="{env.env_ns}" '
        's:mustUnderstand="1">42</tx:Transaction>'
    )
    res = env.post()
    assert_fault(
        res, wsn.version, code="MustUnderstand", status=500, mentions="{urn:example:tx}Transaction"
    )


def test_faults_relate_to_the_request_message_id(wsn):
    env = wsn.envelope("Unsubscribe", f"{wsn.endpoint}subscriptions/{UNKNOWN_ID}")
    res = env.post()
    assert res.fault_name == "ResourceUnknownFault"
    assert res.findtext(".//wsa:RelatesTo") == env.message_id


# ----------------------------------------------------------------------------- fault details


def _destroyed_twice(wsn: WsnClient) -> Reply:
    pull_point = wsn.call("CreatePullPoint").findtext(".//wsnt:PullPoint/wsa:Address")
    assert wsn.call("DestroyPullPoint", pull_point).status == 200
    return wsn.call("DestroyPullPoint", pull_point)


def _renewed_into_the_past(wsn: WsnClient) -> Reply:
    res = wsn.subscribe("http://127.0.0.1:9/never", "ALL2", termination="PT1H").post()
    address = res.findtext(".//wsnt:SubscriptionReference/wsa:Address")
    return wsn.call("Renew", address, TerminationTime="2001-01-01T00:00:00Z")


def _filtered(wsn: WsnClient, tag: str, dialect: str | None, text: str) -> Reply:
    element = etree.Element(tag, **({"Dialect": dialect} if dialect else {}))
    element.text = text
    return subscribe_with_filter(wsn, element)


FAULT_CASES = {
    "InvalidTopicExpressionFault": lambda wsn: topic_request(
        wsn, "Subscribe", "ALL//", ns.DIALECT_FULL
    ).post(),
    "TopicExpressionDialectUnknownFault": lambda wsn: topic_request(
        wsn, "Notify", "ALL", "urn:example:dialect"
    ).post(),
    "TopicNotSupportedFault": lambda wsn: topic_request(
        wsn, "Subscribe", "NOWHERE", ns.DIALECT_SIMPLE
    ).post(),
    "UnacceptableInitialTerminationTimeFault": lambda wsn: wsn.subscribe(
        "http://127.0.0.1:9/never", "ALL", termination="2001-01-01T00:00:00Z"
    ).post(),
    "UnacceptableTerminationTimeFault": _renewed_into_the_past,
    "ResourceUnknownFault": lambda wsn: wsn.call(
        "GetMessages", f"{wsn.endpoint}pullpoints/{UNKNOWN_ID}"
    ),
    "InvalidFilterFault": lambda wsn: _filtered(wsn, "{urn:example:f}Producer", None, "x"),
    "InvalidMessageContentExpressionFault": lambda wsn: _filtered(
        wsn, f"{T}MessageContent", ns.FILTER_XPATH, "//["
    ),
    "NoCurrentMessageOnTopicFault": lambda wsn: wsn.call(
        "GetCurrentMessage", Topic=wsn.topic("ALL:ALARM:ALARM1:ALARM11:ALARM115")
    ),
    "UnableToDestroyPullPointFault": _destroyed_twice,
}


@pytest.mark.parametrize(
    "fault",
    list(FAULT_CASES),
)
def test_every_wsn_fault_detail_is_valid_against_the_oasis_schema(wsn, fault):
    res = FAULT_CASES[fault](wsn)

    assert res.fault_name == fault, res.body
    detail = res.root.find(f".//{{*}}{fault}")
    assert detail.findtext(f"{{{ns.WSRF_BF}}}Timestamp")
    assert schema_errors(detail) == []


# ----------------------------------------------------------------------------- nothing else hurt


def test_bad_requests_leave_accepted_notifications_and_subscriptions_untouched(
    wsn, consumer_factory, platform
):
    topic = "ALL:ALARM:ALARM1:ALARM11:ALARM113"
    consumer = consumer_factory()
    assert wsn.subscribe(consumer.url, topic).post().status == 200
    assert wsn.notify((topic, "<ok>before</ok>")).post().status == 202

    bad = [
        post_raw(wsn, b"<s:Envelope"),
        post_raw(wsn, envelope_around(wsn, "&x;", prolog='<!DOCTYPE s [<!ENTITY x "y">]>')),
        # A Notify is all or nothing: its valid first message must not be delivered either.
        wsn.notify((topic, "<bad>half</bad>"), ("NOWHERE", "<bad>rest</bad>")).post(),
        wsn.notify(("ALL//", "<bad/>"), dialect=ns.DIALECT_FULL).post(),
        wsn.subscribe(consumer.url, topic, termination="yesterday").post(),
        wsn.call("Unsubscribe", f"{wsn.endpoint}subscriptions/{UNKNOWN_ID}"),
        wsn.call("GetMessages", f"{wsn.endpoint}pullpoints/{UNKNOWN_ID}"),
    ]
    assert all(r.status in (400, 500) for r in bad), [r.status for r in bad]

    assert wsn.notify((topic, "<ok>after</ok>")).post().status == 202
    assert consumer.wait_for(2)
    assert consumer.payload_texts() == ["before", "after"]
    assert all(p.poll() is None for p in platform.procs.values())
