"""CloudEvents 1.0 in structured JSON mode for pushes to webhook consumers. Pure Python, no Django.

A subscription with `format: cloudevents` receives, instead of a `wsnt:Notify`, one JSON event per
notification (a batch as `application/cloudevents-batch+json`, a JSON array of events):

- `id`: the notification's stable id (the same on a redelivery, so a consumer can drop it),
- `source`: the broker (its public base URL),
- `type`: the topic path (`ALL:ALARM:ALARM1`),
- `time`: when the broker accepted the notification,
- `datacontenttype` and `data`: an XML payload as a string (`application/xml`), a JSON payload
  published over REST as the JSON value itself (`application/json`).

A JSON payload travels through the broker inside `wsnt:Message` as one `hpwsn:Json` element whose
text is the JSON document (`json_message_xml`), so it is stored, filtered, fragmented and
dead-lettered exactly as an XML payload is, and SOAP subscribers receive it too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any
from xml.sax.saxutils import escape

from lxml import etree

from hpwsn import ns

SPECVERSION = "1.0"
CONTENT_TYPE = "application/cloudevents+json; charset=utf-8"
BATCH_CONTENT_TYPE = "application/cloudevents-batch+json; charset=utf-8"
JSON_TAG = f"{{{ns.HPWSN}}}Json"
_WSNT = f"{{{ns.WSNT}}}"
# Our own stored data, never a publisher's raw bytes (those went through hpwsn.xmlsafe): still no
# entities, no network.
_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=False)


def json_message_xml(value: Any) -> bytes:
    """The `hpwsn:Json` element that carries a JSON payload inside `wsnt:Message`."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return f'<hpwsn:Json xmlns:hpwsn="{ns.HPWSN}">{escape(text)}</hpwsn:Json>'.encode()


def topic_path_of(text: str, nsmap: Mapping[str | None, str]) -> str:
    """The colon path of a concrete topic as a publisher wrote it (`tns:ALL/ALARM` -> ALL:ALARM)."""
    text = text.strip()
    if "/" in text:
        names = text.split("/")
        names[0] = names[0].split(":", 1)[-1]
        return ":".join(names)
    head, sep, rest = text.partition(":")
    # A Simple-dialect QName `tns:ALL` names the root ALL; a colon path names a whole path.
    if sep and head in nsmap and ":" not in rest:
        return rest
    return text


def _data(message: etree._Element | None) -> tuple[str, Any]:
    """(datacontenttype, data) of a wsnt:Message."""
    if message is None:
        return "application/xml", ""
    children = [c for c in message if isinstance(c.tag, str)]
    if len(children) == 1 and children[0].tag == JSON_TAG:
        try:
            return "application/json", json.loads(children[0].text or "null")
        except ValueError:
            return "text/plain", children[0].text or ""
    if not children:
        return "text/plain", message.text or ""
    return "application/xml", "".join(_standalone(c) for c in children)


def _standalone(el: etree._Element) -> str:
    """The element as its own document, without the envelope's unused namespace declarations."""
    copy = etree.fromstring(etree.tostring(el, with_tail=False), _PARSER)
    etree.cleanup_namespaces(copy)
    return etree.tostring(copy, encoding="unicode")


def payload_data(content: bytes) -> tuple[str, Any]:
    """(datacontenttype, data) of what was inside a wsnt:Message (GetCurrentMessage's content)."""
    root = etree.fromstring(
        b'<wsnt:Message xmlns:wsnt="' + ns.WSNT.encode() + b'">' + content + b"</wsnt:Message>",
        _PARSER,
    )
    return _data(root)


def event(
    *, notification_id: str, source: str, accepted_at: float, fragment: bytes
) -> dict[str, Any]:
    """The CloudEvent of one stored notification (the broker's NotificationMessage fragment)."""
    root = etree.fromstring(
        b'<m xmlns:wsnt="' + ns.WSNT.encode() + b'">' + fragment + b"</m>", _PARSER
    )
    topic = root.find(f"{_WSNT}Topic")
    datacontenttype, data = _data(root.find(f"{_WSNT}Message"))
    when = datetime.fromtimestamp(accepted_at, tz=UTC)
    return {
        "specversion": SPECVERSION,
        "id": notification_id,
        "source": source,
        "type": topic_path_of(topic.text or "", topic.nsmap) if topic is not None else "",
        "time": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "datacontenttype": datacontenttype,
        "data": data,
    }


def event_body(event: dict[str, Any]) -> bytes:
    """One event in structured mode (`application/cloudevents+json`)."""
    return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()


def batch_body(events: Iterable[dict[str, Any]]) -> bytes:
    """A structured-mode batch: the JSON array of the events, in order."""
    return json.dumps(list(events), ensure_ascii=False, separators=(",", ":")).encode()
