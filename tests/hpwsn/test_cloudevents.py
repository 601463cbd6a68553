"""The pure CloudEvents encoder and the REST payload builder (no Django, no I/O)."""

from __future__ import annotations

import json
import math

import pytest
from cloudevents.core.formats.json import JSONFormat
from lxml import etree

from hpwsn import cloudevents, ns, restpublish, wsn
from hpwsn.soap import parse_request

LIMITS = {"max_bytes": 100_000, "max_depth": 32}


def _soap_notification(topic: str, payload: str) -> wsn.NotificationIn:
    envelope = (
        f'<s:Envelope xmlns:s="{ns.SOAP11}" xmlns:wsnt="{ns.WSNT}"><s:Body><wsnt:Notify>'
        f'<wsnt:NotificationMessage><wsnt:Topic Dialect="{ns.DIALECT_SIMPLE}">{topic}</wsnt:Topic>'
        f"<wsnt:Message>{payload}</wsnt:Message></wsnt:NotificationMessage>"
        "</wsnt:Notify></s:Body></s:Envelope>"
    ).encode()
    req = parse_request(envelope, content_type="text/xml", **LIMITS)
    return wsn.parse_notify(req.body)[0]


def _message_children(fragment: bytes) -> list[bytes]:
    root = etree.fromstring(b'<m xmlns:wsnt="' + ns.WSNT.encode() + b'">' + fragment + b"</m>")
    message = root.find(f"{{{ns.WSNT}}}Message")
    assert message is not None
    copies = []
    for child in message:
        copy = etree.fromstring(etree.tostring(child))
        etree.cleanup_namespaces(copy)
        copies.append(etree.tostring(copy, method="c14n"))
    return copies


def test_a_rest_message_is_stored_as_the_same_soap_notify_would_be():
    payload = '<alarm xmlns="urn:demo" level="3">fire <b>now</b></alarm>'
    rest = restpublish.notification_of(topic="ALL:ALARM", xml=payload, **LIMITS)
    soap = _soap_notification("ALL:ALARM", payload)
    assert rest.topic is not None
    assert soap.topic is not None
    assert (rest.topic.text, rest.topic.dialect) == (soap.topic.text, soap.topic.dialect)
    rest_fragment, soap_fragment = wsn.stored_fragment(rest), wsn.stored_fragment(soap)
    assert _message_children(rest_fragment) == _message_children(soap_fragment)


@pytest.mark.parametrize(
    ("xml", "why"),
    [
        ('<!DOCTYPE a [<!ENTITY x "y">]><a>&x;</a>', "DTD"),
        ("<a/><b/>", "junk"),
        ("<a>", "unclosed"),
        ("", "empty"),
    ],
)
def test_it_refuses_bad_xml_payloads(xml, why):
    with pytest.raises(restpublish.PayloadRejected):
        restpublish.notification_of(topic="ALL", xml=xml, **LIMITS)


def test_it_refuses_a_message_with_both_or_no_payloads():
    with pytest.raises(restpublish.PayloadRejected):
        restpublish.notification_of(topic="ALL", xml="<a/>", json_value=1, has_json=True, **LIMITS)
    with pytest.raises(restpublish.PayloadRejected):
        restpublish.notification_of(topic="ALL", **LIMITS)
    with pytest.raises(restpublish.PayloadRejected):
        restpublish.notification_of(topic="ALL", json_value=math.nan, has_json=True, **LIMITS)


def test_a_json_payload_comes_out_of_a_cloudevent_as_it_went_in():
    value = {"text": "<&> ünïcode", "n": [1, 2.5, None, True]}
    n = restpublish.notification_of(topic="ALL:ALARM", json_value=value, has_json=True, **LIMITS)
    event = cloudevents.event(
        notification_id="0" * 32,
        source="http://broker/",
        accepted_at=1_764_000_000.25,
        fragment=wsn.stored_fragment(n),
    )
    parsed = JSONFormat().read(None, cloudevents.event_body(event))
    assert parsed.get_data() == value
    assert parsed.get_datacontenttype() == "application/json"
    assert parsed.get_type() == "ALL:ALARM"
    assert parsed.get_id() == "0" * 32
    assert event["time"] == "2025-11-24T16:00:00.250Z"


def test_an_xml_payload_is_a_standalone_string_and_a_batch_is_an_array():
    n = _soap_notification("ALL:ALARM", '<a xmlns="urn:x">1</a>')
    event = cloudevents.event(
        notification_id="1" * 32, source="s", accepted_at=0.0, fragment=wsn.stored_fragment(n)
    )
    assert event["data"] == '<a xmlns="urn:x">1</a>'
    assert event["datacontenttype"] == "application/xml"
    batch = json.loads(cloudevents.batch_body([event, event]))
    assert [JSONFormat().read(None, json.dumps(e)).get_id() for e in batch] == ["1" * 32] * 2


@pytest.mark.parametrize(
    ("text", "nsmap", "path"),
    [
        ("ALL:ALARM:ALARM1", {}, "ALL:ALARM:ALARM1"),
        ("tns:ALL/ALARM", {"tns": "urn:t"}, "ALL:ALARM"),
        ("tns:ALL", {"tns": "urn:t"}, "ALL"),
        ("ALL", {}, "ALL"),
    ],
)
def test_the_event_type_is_the_topic_path(text, nsmap, path):
    assert cloudevents.topic_path_of(text, nsmap) == path
