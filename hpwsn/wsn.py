"""WS-BaseNotification / WS-BrokeredNotification bodies: requests, responses, pushes."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from lxml import etree

from hpwsn import fragment, ns
from hpwsn.errors import unknown_filter_xml
from hpwsn.soap import SoapFault, wsn_fault
from hpwsn.xsdtime import format_datetime

T = f"{{{ns.WSNT}}}"
A = f"{{{ns.WSA}}}"


@dataclass(slots=True)
class TopicRef:
    text: str
    dialect: str | None
    nsmap: dict[str, str]

    @classmethod
    def from_element(cls, el: etree._Element) -> TopicRef:
        nsmap = {k or "": v for k, v in el.nsmap.items()}
        return cls(text=(el.text or "").strip(), dialect=el.get("Dialect"), nsmap=nsmap)


@dataclass(slots=True)
class Package:
    """The thesis's fragmentation header (5.3.3.4): <wsnt:Package><Identification/><Fragment/>."""

    identification: str
    fragmented: bool
    more: bool
    partial_allowed: bool
    offset: int


@dataclass(slots=True)
class NotificationIn:
    topic: TopicRef | None
    topic_xml: bytes  # the publisher's wsnt:Topic, with its namespace bindings
    message_xml: bytes  # the whole wsnt:Message element
    content_xml: bytes  # what is inside wsnt:Message (for GetCurrentMessage and raw delivery)
    producer_xml: bytes = b""
    package: Package | None = None
    package_xml: bytes = b""
    message_el: etree._Element | None = None


@dataclass(slots=True)
class SubscribeIn:
    consumer_address: str
    topic: TopicRef | None
    message_content: TopicRef | None  # text = XPath, dialect, nsmap
    initial_termination_time: str | None
    use_raw: bool = False
    signing_secret: str = ""  # hpwsn:SigningSecret: HMAC-sign every push (Standard Webhooks)
    subscriber_address: str | None = None  # legacy HPwsn: the real push target
    push_format: str = "wsn"  # hpwsn:Format: wsn (a wsnt:Notify) or cloudevents
    unsupported_policies: list[str] = field(default_factory=list)
    producer_properties: TopicRef | None = None  # text = expression, dialect, nsmap
    # hpwsn:FilterParameters: the texts of %0, %1, ... in order (hpwsn.sqlfilter reads them)
    filter_parameters: list[str] = field(default_factory=list)
    # hpwsn:InterestPath of a peer site's link: its hpwsn:Site texts in order (federation);
    # None when the Subscribe has none
    interest_path: list[str] | None = None
    # hpwsn:Peers of a peer site's link: that site's other peers, which it asks for its interest
    # itself (federation); None when the Subscribe has none
    site_peers: list[str] | None = None


@dataclass(slots=True)
class RegisterPublisherIn:
    publisher_address: str | None  # PublisherReference/wsa:Address
    topics: list[TopicRef]
    demand: bool
    initial_termination_time: str | None


def _text(el: etree._Element | None) -> str | None:
    return None if el is None else (el.text or "").strip()


def _inner(el: etree._Element) -> bytes:
    children = [c for c in el if isinstance(c.tag, str)]
    if not children:
        return escape(el.text or "").encode()
    return b"".join(etree.tostring(c, with_tail=False) for c in children)


def parse_package(el: etree._Element) -> Package:
    ident = _text(el.find("Identification"))
    if ident is None:
        ident = _text(el.find(f"{T}Identification"))
    frag = _text(el.find("Fragment"))
    if frag is None:
        frag = _text(el.find(f"{T}Fragment"))
    if not ident or not frag:
        raise SoapFault("wsnt:Package needs both Identification and Fragment")
    try:
        flags = fragment.parse_flags(frag)
    except fragment.FragmentError as exc:
        raise SoapFault(str(exc)) from None
    return Package(ident, flags.fragmented, flags.more, flags.partial_allowed, flags.offset)


_QNAME_PREFIX = re.compile(r"(?<![\w.:-])([A-Za-z_][\w.-]*):[A-Za-z_*]")
# What every match of _QNAME_PREFIX holds: a search for it skips the texts with none (a Dialect's
# URI, whose colon a slash follows) for a fraction of the cost of the full pattern's.
_QNAME_COLON = re.compile(r":[A-Za-z_*]")


def standalone(el: etree._Element) -> etree._Element:
    """A copy of `el` that declares only the namespaces it uses: in its names, or as the prefix
    of a QName in its text or attribute values (a topic `tns:ALARM`, an `xsi:type`).

    Serialising an element copies every declaration in scope onto it: 10,000 unused ones on
    soap:Body made each of 100 messages 240 KB, and took 98 s to accept.
    """
    scope = el.nsmap
    used: set[str] = set()
    for node in el.iter():
        for text in (node.text, *node.attrib.values()):
            if text and ":" in text and _QNAME_COLON.search(text):
                used.update(_QNAME_PREFIX.findall(text))
    wanted = {p: scope[p] for p in used if p in scope}
    # A deep copy (lxml's copy of an element is always deep): it declares the namespaces its names
    # use, no others.
    copy = el.__copy__()
    if wanted:
        # Declared on a parent, the QName prefixes are serialised with the element.
        holder = etree.Element("holder", nsmap=wanted)
        holder.append(copy)
    return copy


def children(el: etree._Element) -> dict[Any, etree._Element]:
    """The first child of each tag, in one pass: a `find` for each walks lxml's ElementPath (the
    finds of reading a Notify were 8.5 % of the instructions of accepting it)."""
    first: dict[Any, etree._Element] = {}
    for child in el:
        first.setdefault(child.tag, child)
    return first


_TOPIC, _MESSAGE, _PRODUCER, _PACKAGE = (
    f"{T}Topic", f"{T}Message", f"{T}ProducerReference", f"{T}Package",
)  # fmt: skip


def parse_notification_message(el: etree._Element) -> NotificationIn:
    topic_in = children(el).get(_TOPIC)  # its in-scope prefixes resolve the topic expression
    parts = children(standalone(el))
    topic_el = parts.get(_TOPIC)
    message_el = parts.get(_MESSAGE)
    if message_el is None:
        raise SoapFault("a NotificationMessage must contain a wsnt:Message")
    producer_el = parts.get(_PRODUCER)
    package_el = parts.get(_PACKAGE)
    return NotificationIn(
        topic=TopicRef.from_element(topic_in) if topic_in is not None else None,
        topic_xml=etree.tostring(topic_el, with_tail=False) if topic_el is not None else b"",
        message_xml=etree.tostring(message_el, with_tail=False),
        content_xml=_inner(message_el),
        producer_xml=etree.tostring(producer_el, with_tail=False)
        if producer_el is not None
        else b"",
        package=parse_package(package_el) if package_el is not None else None,
        package_xml=etree.tostring(package_el, with_tail=False) if package_el is not None else b"",
        message_el=message_el,
    )


_NOTIFICATION_MESSAGE = f"{T}NotificationMessage"


def parse_notify(body: etree._Element) -> list[NotificationIn]:
    msgs = [c for c in body if c.tag == _NOTIFICATION_MESSAGE]
    if not msgs:
        raise SoapFault("Notify carries no wsnt:NotificationMessage")
    return [parse_notification_message(m) for m in msgs]


def parse_subscribe(body: etree._Element) -> SubscribeIn:
    consumer = body.find(f"{T}ConsumerReference")
    address = _text(consumer.find(f"{A}Address")) if consumer is not None else None
    legacy_target = _text(body.find(f"{T}SubscriberAddress"))
    if not address and not legacy_target:
        raise SoapFault("Subscribe needs a ConsumerReference with a wsa:Address")
    topic = content = producer = None
    filt = body.find(f"{T}Filter")
    if filt is not None:
        for child in filt:
            if not isinstance(child.tag, str):
                continue
            if child.tag == f"{T}TopicExpression":
                if topic is not None:
                    raise wsn_fault(
                        "InvalidFilterFault",
                        "only one TopicExpression is supported",
                        detail_xml=unknown_filter_xml(ns.WSNT, "TopicExpression"),
                    )
                topic = TopicRef.from_element(child)
            elif child.tag == f"{T}MessageContent":
                content = TopicRef.from_element(child)
            elif child.tag == f"{T}ProducerProperties":
                producer = TopicRef.from_element(child)
            else:
                qname = etree.QName(child)
                raise wsn_fault(
                    "InvalidFilterFault",
                    f"filter {qname.localname} is not supported",
                    detail_xml=unknown_filter_xml(qname.namespace, qname.localname),
                )
    use_raw = False
    signing_secret = ""
    parameters: list[str] = []
    push_format = "wsn"
    interest_path: list[str] | None = None
    site_peers: list[str] | None = None
    unsupported: list[str] = []
    policy = body.find(f"{T}SubscriptionPolicy")
    if policy is not None:
        for child in policy:
            if isinstance(child.tag, str):
                if child.tag == f"{T}UseRaw":
                    use_raw = True
                elif child.tag == f"{{{ns.HPWSN}}}SigningSecret":
                    signing_secret = (child.text or "").strip()
                elif child.tag == f"{{{ns.HPWSN}}}FilterParameters":
                    # Not stripped: a parameter's spaces may be part of the value.
                    parameters = [
                        p.text or "" for p in child if p.tag == f"{{{ns.HPWSN}}}Parameter"
                    ]
                elif child.tag == f"{{{ns.HPWSN}}}Format":
                    push_format = (child.text or "").strip()
                elif child.tag == f"{{{ns.HPWSN}}}InterestPath":
                    interest_path = [
                        (site.text or "").strip()
                        for site in child
                        if site.tag == f"{{{ns.HPWSN}}}Site"
                    ]
                elif child.tag == f"{{{ns.HPWSN}}}Peers":
                    site_peers = [
                        (site.text or "").strip()
                        for site in child
                        if site.tag == f"{{{ns.HPWSN}}}Site"
                    ]
                else:
                    unsupported.append(etree.QName(child).localname)
    return SubscribeIn(
        consumer_address=address or legacy_target or "",
        topic=topic,
        message_content=content,
        initial_termination_time=_text(body.find(f"{T}InitialTerminationTime")),
        use_raw=use_raw,
        signing_secret=signing_secret,
        subscriber_address=legacy_target,
        unsupported_policies=unsupported,
        producer_properties=producer,
        filter_parameters=parameters,
        push_format=push_format,
        interest_path=interest_path,
        site_peers=site_peers,
    )


BR = f"{{{ns.WSNBR}}}"


def parse_register_publisher(body: etree._Element) -> RegisterPublisherIn:
    """WS-BrokeredNotification RegisterPublisher: PublisherReference, Topic*, Demand, time."""
    ref = body.find(f"{BR}PublisherReference")
    demand = (_text(body.find(f"{BR}Demand")) or "false").lower()
    if demand not in ("true", "false", "1", "0"):
        raise SoapFault(f"Demand '{demand}' is not an xsd:boolean")
    return RegisterPublisherIn(
        publisher_address=_text(ref.find(f"{A}Address")) if ref is not None else None,
        topics=[TopicRef.from_element(t) for t in body.findall(f"{BR}Topic")],
        demand=demand in ("true", "1"),
        initial_termination_time=_text(body.find(f"{BR}InitialTerminationTime")),
    )


def producer_address(n: NotificationIn) -> str | None:
    """The wsa:Address of a message's ProducerReference, or None."""
    if not n.producer_xml:
        return None
    found = etree.fromstring(n.producer_xml).findtext(f"{A}Address")
    return found.strip() if found else None


def register_publisher_response(registration: str, consumer: str) -> str:
    return (
        f'<wsnbr:RegisterPublisherResponse xmlns:wsnbr="{ns.WSNBR}">'
        f"<wsnbr:PublisherRegistrationReference>{epr(registration)}"
        f"</wsnbr:PublisherRegistrationReference>"
        f"<wsnbr:ConsumerReference>{epr(consumer)}</wsnbr:ConsumerReference>"
        "</wsnbr:RegisterPublisherResponse>"
    )


def destroy_registration_response() -> str:
    return f'<wsnbr:DestroyRegistrationResponse xmlns:wsnbr="{ns.WSNBR}"/>'


def parse_termination_time(body: etree._Element) -> str | None:
    return _text(body.find(f"{T}TerminationTime"))


def parse_maximum_number(body: etree._Element) -> int | None:
    raw = _text(body.find(f"{T}MaximumNumber"))
    if raw is None or raw == "":
        return None
    if not raw.isdigit():
        raise SoapFault(f"MaximumNumber '{raw}' is not a non-negative integer")
    return int(raw)


def parse_topic_of(body: etree._Element) -> TopicRef:
    el = body.find(f"{T}Topic")
    if el is None:
        raise wsn_fault("InvalidTopicExpressionFault", "the request names no wsnt:Topic")
    return TopicRef.from_element(el)


# ----------------------------------------------------------------------------- responses


def epr(address: str) -> str:
    return f"<wsa:Address>{escape(address)}</wsa:Address>"


def _times(current: datetime, termination: datetime | None) -> str:
    term = (
        f"<wsnt:TerminationTime>{format_datetime(termination)}</wsnt:TerminationTime>"
        if termination
        else f'<wsnt:TerminationTime xmlns:xsi="{ns.XSI}" xsi:nil="true"/>'
    )
    return f"<wsnt:CurrentTime>{format_datetime(current)}</wsnt:CurrentTime>{term}"


def subscribe_response(address: str, current: datetime, termination: datetime | None) -> str:
    return (
        f"<wsnt:SubscribeResponse><wsnt:SubscriptionReference>{epr(address)}"
        f"</wsnt:SubscriptionReference>{_times(current, termination)}</wsnt:SubscribeResponse>"
    )


def renew_response(current: datetime, termination: datetime | None) -> str:
    term = _times(current, termination)
    # Renew answers TerminationTime first, then CurrentTime (b-2.xsd RenewResponse).
    first, second = term.split("</wsnt:CurrentTime>")
    return f"<wsnt:RenewResponse>{second}{first}</wsnt:CurrentTime></wsnt:RenewResponse>"


def empty_response(name: str) -> str:
    return f"<wsnt:{name}/>"


def create_pull_point_response(address: str) -> str:
    return (
        f"<wsnt:CreatePullPointResponse><wsnt:PullPoint>{epr(address)}</wsnt:PullPoint>"
        "</wsnt:CreatePullPointResponse>"
    )


def _subscription_reference(subscription_address: str | None) -> bytes:
    if not subscription_address:
        return b""
    return (
        f"<wsnt:SubscriptionReference>{epr(subscription_address)}</wsnt:SubscriptionReference>"
    ).encode()


def notification_messages(items: list[tuple[str | None, bytes]]) -> bytes:
    """One wsnt:NotificationMessage per item (its subscription's address, a stored fragment:
    Topic, ProducerReference, Message), joined. The reference of an address is made once: a push
    carries one subscription's messages, all with the same."""
    refs: dict[str | None, bytes] = {}
    parts: list[bytes] = []
    for address, stored in items:
        ref = refs.get(address)
        if ref is None:
            ref = refs[address] = _subscription_reference(address)
        parts += (b"<wsnt:NotificationMessage>", ref, stored, b"</wsnt:NotificationMessage>")
    return b"".join(parts)


def get_messages_response(items: list[tuple[str | None, bytes]]) -> bytes:
    return (
        b"<wsnt:GetMessagesResponse>"
        + notification_messages(items)
        + b"</wsnt:GetMessagesResponse>"
    )


def get_current_message_response(content: bytes) -> bytes:
    return b"<wsnt:GetCurrentMessageResponse>" + content + b"</wsnt:GetCurrentMessageResponse>"


def notify_envelope(
    *,
    version: str,
    to: str,
    message_id: str,
    items: list[tuple[str | None, bytes]],
    ids: list[str] | None = None,
) -> bytes:
    """The wsnt:Notify pushed to a consumer, with WS-Addressing To/Action/MessageID.

    `ids` are the broker's stable ids of the messages, in order, carried after them in
    `hpwsn:MessageIds` (Notify allows elements of other namespaces there) so that a consumer can
    drop a message it already received when a batch is redelivered.
    """
    extension = b""
    if ids:
        extension = (
            f'<hpwsn:MessageIds xmlns:hpwsn="{ns.HPWSN}">'
            # Ids the broker made are letters and digits: only another's need escaping.
            + "".join(f"<hpwsn:Id>{i if i.isalnum() else escape(i)}</hpwsn:Id>" for i in ids)
            + "</hpwsn:MessageIds>"
        ).encode()
    env_ns = ns.SOAP11 if version == "1.1" else ns.SOAP12
    return (
        (
            f'<?xml version="1.0" encoding="utf-8"?><soap:Envelope xmlns:soap="{env_ns}" '
            f'xmlns:wsa="{ns.WSA}" xmlns:wsnt="{ns.WSNT}"><soap:Header>'
            f"<wsa:To>{escape(to)}</wsa:To><wsa:Action>{ns.ACTION_NOTIFY}</wsa:Action>"
            f"<wsa:MessageID>{escape(message_id)}</wsa:MessageID></soap:Header><soap:Body><wsnt:Notify>"
        ).encode()
        + notification_messages(items)
        + extension
        + b"</wsnt:Notify></soap:Body></soap:Envelope>"
    )


def stored_fragment(n: NotificationIn, *, default_topic_xml: bytes = b"") -> bytes:
    """What the broker keeps of an accepted notification and replays into every push."""
    # A fragment keeps its Package header so the consumer can reassemble; whole messages drop it.
    package = n.package_xml if n.package is not None and n.package.fragmented else b""
    return (n.topic_xml or default_topic_xml) + n.producer_xml + package + n.message_xml


def topic_element(text: str, dialect: str, nsmap: dict[str, str] | None = None) -> bytes:
    decls = "".join(f" xmlns:{p}={quoteattr(u)}" for p, u in (nsmap or {}).items() if p)
    return f"<wsnt:Topic Dialect={quoteattr(dialect)}{decls}>{escape(text)}</wsnt:Topic>".encode()
