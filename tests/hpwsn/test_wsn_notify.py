"""The wsnt:Notify the broker pushes: each message with its own subscription reference, the ids
after them, whatever characters they hold."""

from __future__ import annotations

from lxml import etree

from hpwsn import ns, wsn

NSMAP = {"wsnt": ns.WSNT, "wsa": ns.WSA, "hpwsn": ns.HPWSN}


def _fragment(text: str) -> bytes:
    return (
        wsn.topic_element("ALL", ns.DIALECT_SIMPLE)
        + f"<wsnt:Message><m>{text}</m></wsnt:Message>".encode()
    )


def test_every_message_keeps_its_own_reference_and_every_id_reads_back_as_given() -> None:
    items = [
        ("http://b/sub/1?a=1&b=2", _fragment("one")),
        ("http://b/sub/1?a=1&b=2", _fragment("two")),
        (None, _fragment("three")),  # a message without a reference
        ("http://b/sub/2", _fragment("four")),
    ]
    ids = ["0123abcdef", "x<&>y", "plain", "fed:origin/7"]

    body = wsn.notify_envelope(version="1.2", to="http://c/", message_id="urn:uuid:1",
                               items=items, ids=ids)  # fmt: skip

    root = etree.fromstring(body)
    messages = root.findall(".//wsnt:Notify/wsnt:NotificationMessage", NSMAP)
    assert [m.findtext("wsnt:Message/m", namespaces=NSMAP) for m in messages] == [
        "one", "two", "three", "four"
    ]  # fmt: skip
    assert [
        m.findtext("wsnt:SubscriptionReference/wsa:Address", namespaces=NSMAP) for m in messages
    ] == ["http://b/sub/1?a=1&b=2", "http://b/sub/1?a=1&b=2", None, "http://b/sub/2"]
    assert [e.text for e in root.findall(".//hpwsn:MessageIds/hpwsn:Id", NSMAP)] == ids


def test_get_messages_answers_each_message_with_its_reference() -> None:
    body = wsn.get_messages_response([("http://b/pp/1", _fragment("a")), (None, _fragment("b"))])

    root = etree.fromstring(
        b'<r xmlns:wsnt="' + ns.WSNT.encode() + b'" xmlns:wsa="' + ns.WSA.encode() + b'">'
        + body + b"</r>"
    )  # fmt: skip
    refs = [
        m.findtext("wsnt:SubscriptionReference/wsa:Address", namespaces=NSMAP)
        for m in root.findall(".//wsnt:NotificationMessage", NSMAP)
    ]
    assert refs == ["http://b/pp/1", None]
