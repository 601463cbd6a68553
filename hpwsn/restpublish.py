"""A notification published over REST, turned into the NotificationMessage a SOAP Notify carries.

Pure Python (no Django): the REST edge builds the same `wsnt:NotificationMessage` element a SOAP
publisher would have sent and hands it to the very parser the SOAP edge uses, so what is stored
and pushed is byte for byte what a `Notify` with that topic and payload gives.
"""

from __future__ import annotations

from typing import Any

from lxml import etree

from hpwsn import cloudevents, ns, wsn
from hpwsn.xmlsafe import XMLRejected
from hpwsn.xmlsafe import parse as parse_xml

_W = f"{{{ns.WSNT}}}"


class PayloadRejected(ValueError):
    """The payload is not one XML element or not valid JSON (the message says why)."""


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
    else:
        try:
            payload = etree.fromstring(cloudevents.json_message_xml(json_value))
        except ValueError as exc:  # NaN or Infinity have no JSON spelling
            raise PayloadRejected(f"the JSON payload is rejected: {exc}") from None
    nm = etree.Element(f"{_W}NotificationMessage", nsmap={"wsnt": ns.WSNT})
    topic_el = etree.SubElement(nm, f"{_W}Topic", Dialect=dialect)
    topic_el.text = topic
    etree.SubElement(nm, f"{_W}Message").append(payload)
    return wsn.parse_notification_message(nm)
