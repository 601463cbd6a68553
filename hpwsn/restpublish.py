"""A notification published over REST, turned into the NotificationMessage a SOAP Notify carries.

Pure Python (no Django). The REST edge hands `dispatch.accept.notifications_accept` the same
`wsn.NotificationIn` the SOAP parser makes of a `wsnt:NotificationMessage` with that topic and
payload: a `wsnt:Topic` in the Simple dialect and a `wsnt:Message` around the payload. An XML
payload goes through the same hardened parser as a SOAP request; the parts are then assembled as
bytes, without parsing an envelope around them again (a batch of 100 costs a third as much).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from lxml import etree

from hpwsn import cloudevents, ns, wsn
from hpwsn.xmlsafe import XMLRejected
from hpwsn.xmlsafe import parse as parse_xml

_MESSAGE = (f'<wsnt:Message xmlns:wsnt="{ns.WSNT}">'.encode(), b"</wsnt:Message>")


class PayloadRejected(ValueError):
    """The payload is not one XML element or not valid JSON (the message says why)."""


@lru_cache(maxsize=4096)
def _topic(topic: str, dialect: str) -> tuple[wsn.TopicRef, bytes]:
    nsmap = {"wsnt": ns.WSNT}
    return wsn.TopicRef(text=topic, dialect=dialect, nsmap=nsmap), wsn.topic_element(
        topic, dialect, nsmap
    )


def notification_of(
    *,
    topic: str,
    xml: str | None = None,
    json_value: Any = None,
    has_json: bool = False,
    dialect: str = ns.DIALECT_SIMPLE,
    max_bytes: int,
    max_depth: int,
) -> wsn.NotificationIn:
    """One NotificationMessage on `topic` with an XML payload (one element) or a JSON value."""
    if (xml is None) == (not has_json):
        raise PayloadRejected("give exactly one of an XML payload or a JSON payload")
    if xml is not None:
        try:
            payload = parse_xml(xml.encode(), max_bytes=max_bytes, max_depth=max_depth)
        except XMLRejected as exc:
            raise PayloadRejected(f"the XML payload is rejected: {exc}") from None
        content = etree.tostring(payload)
    else:
        try:
            content = cloudevents.json_message_xml(json_value)
        except ValueError as exc:  # NaN or Infinity have no JSON spelling
            raise PayloadRejected(f"the JSON payload is rejected: {exc}") from None
    ref, topic_xml = _topic(topic, dialect)
    return wsn.NotificationIn(
        topic=ref,
        topic_xml=topic_xml,
        message_xml=_MESSAGE[0] + content + _MESSAGE[1],
        content_xml=content,
    )
