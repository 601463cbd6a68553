"""A received NotificationMessage's parts are stored with the namespaces the message uses (in its
names, and as QName prefixes in its texts and attribute values), and no others."""

from __future__ import annotations

from lxml import etree

from hpwsn import ns, wsn

XSI = "http://www.w3.org/2001/XMLSchema-instance"


def _message(body: str) -> etree._Element:
    envelope = (
        f'<s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope" xmlns:wsnt="{ns.WSNT}"'
        ' xmlns:tns="urn:topics" xmlns:t2="urn:types" xmlns:http="urn:not-a-scheme"'
        f' xmlns:xsi="{XSI}" xmlns:unused="urn:unused">'
        f"<s:Body><wsnt:Notify><wsnt:NotificationMessage>{body}</wsnt:NotificationMessage>"
        "</wsnt:Notify></s:Body></s:Envelope>"
    )
    return etree.fromstring(envelope).find(f".//{{{ns.WSNT}}}NotificationMessage")


def test_the_parts_declare_the_prefixes_the_message_uses_and_nothing_else() -> None:
    n = wsn.parse_notification_message(
        _message(
            f'<wsnt:Topic Dialect="{ns.DIALECT_SIMPLE}">tns:ALARM</wsnt:Topic>'
            '<wsnt:Message><m xsi:type="t2:Alarm" href="http://x/y"><v>1</v></m></wsnt:Message>'
        )
    )

    used = {"wsnt": ns.WSNT, "tns": "urn:topics", "xsi": XSI, "t2": "urn:types"}
    assert etree.fromstring(n.topic_xml).nsmap == used
    assert etree.fromstring(n.message_xml).nsmap == used
    # A URI's scheme is not a prefix, even where a prefix of that name is declared.
    assert b"urn:not-a-scheme" not in n.message_xml
    assert b"urn:unused" not in n.message_xml
    assert n.topic is not None
    assert n.topic.text == "tns:ALARM"


def test_a_qname_after_a_uri_in_one_text_keeps_its_prefix() -> None:
    n = wsn.parse_notification_message(
        _message("<wsnt:Message><q>http://x/a t2:b</q></wsnt:Message>")
    )

    assert etree.fromstring(n.message_xml).nsmap == {"wsnt": ns.WSNT, "t2": "urn:types"}
