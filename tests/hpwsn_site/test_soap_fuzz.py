"""Property-based fuzzing of the SOAP edge, in process, through the ASGI route of /wsn/.

Every request starts as a valid one of an operation the endpoint serves (Notify, Subscribe,
Renew, Unsubscribe, Pause/ResumeSubscription, GetCurrentMessage, CreatePullPoint, GetMessages,
DestroyPullPoint, RegisterPublisher, DestroyRegistration, the legacy WsnProcess envelope) and is
then mutated: elements dropped, duplicated, reordered, renamed into other namespaces or given
undeclared prefixes, odd texts (topics, XPath, durations, numbers, addresses), garbage
attributes, unknown mustUnderstand headers, SOAP 1.1 and 1.2 envelopes under either content type,
other encodings, truncation, documents over the size, depth, namespace and attribute limits.

What must hold for every request (docs/protocol.md, "Faults" and "Hostile input"):
- the answer is 200/202, or a fault status with a SOAP fault of the version the client spoke
  (the VersionMismatch of a SOAP 1.1 envelope sent as SOAP 1.2 is answered in SOAP 1.2), and the
  body reads with the hardened parser;
- no fault is the generic internal error, and nothing is logged as an unexpected error;
- a refused request changes nothing: no message, current message, topic, subscription, pull
  point or registration appears or goes;
- an accepted Notify stores exactly its messages (what each wsnt:Message holds, nothing more).

Run more examples with `--hypothesis-profile=long`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit
from xml.sax.saxutils import escape, quoteattr

import pytest
import redis
from hypothesis import HealthCheck, event, example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from lxml import etree

from dispatch.models import StoredMessage
from dispatch.services import STATS
from hpwsn import ns, sqlfilter
from hpwsn.xmlsafe import XMLRejected, charset_of
from hpwsn.xmlsafe import parse as parse_hardened
from hpwsn_site import state
from hpwsn_site.fastpath import wrap
from hpwsn_site.soapcall import publish_key
from subscriptions.models import PublisherRegistration, PullPoint, Subscription
from topics.acl import ANONYMOUS
from topics.models import Topic
from topics.services import topic_create, topics_load_demo

pytestmark = pytest.mark.django_db(transaction=True)

LIMIT = 32 * 1024  # HPWSN_MAX_REQUEST_BYTES here: a few documents go over it cheaply
HOST = "127.0.0.1:8000"
BASE = f"http://{HOST}"
INTERNAL = "internal error; the request was not processed"
UNEXPECTED = "unexpected error while serving a SOAP request"
CT11, CT12 = "text/xml; charset=utf-8", "application/soap+xml; charset=utf-8"
ENV_NS = {"1.1": ns.SOAP11, "1.2": ns.SOAP12}
FAULT_STATUSES = {400, 401, 403, 404, 413, 415, 500, 503}
PUBLISHER = "http://127.0.0.1:9/fuzz-publisher"  # registered for Gated (require_registration)
ROOT_NS = "urn:hpwsn:test:fuzz-root"  # the namespace of the root NSRoot

# ----------------------------------------------------------------------------- an XML model
#
# Requests are built as trees of `El` and written out by hand, so that a mutation can produce
# what lxml would never write: an undeclared prefix, an element in the wrong namespace, a raw
# fragment, a duplicate attribute.


class Raw(str):
    """Text written as is, unescaped."""

    __slots__ = ()


@dataclass(frozen=True)
class El:
    namespace: str | None
    local: str
    prefix: str | None = None
    attrs: tuple[tuple[str, str], ...] = ()
    children: tuple[El | str, ...] = ()
    declare: bool = True  # False: the prefix is used without a declaration in scope


Node = El | str
PREFIXES = {
    ns.WSNT: "wsnt", ns.WSA: "wsa", ns.WSNBR: "wsnbr", ns.HPWSN: "hpwsn", ns.LEGACY: "org",
    ns.WSSE: "wsse", ns.SOAP11: "s", ns.SOAP12: "s", ns.XSI: "xsi",
}  # fmt: skip


def el(namespace: str | None, local: str, *children: Node, attrs: Any = ()) -> El:
    prefix = PREFIXES.get(namespace) if namespace else None
    if namespace and prefix is None:
        prefix = "p"
    return El(namespace, local, prefix, tuple(attrs), tuple(children))


def W(local: str, *children: Node, attrs: Any = ()) -> El:
    return el(ns.WSNT, local, *children, attrs=attrs)


def A(local: str, *children: Node) -> El:
    return el(ns.WSA, local, *children)


def BR(local: str, *children: Node, attrs: Any = ()) -> El:
    return el(ns.WSNBR, local, *children, attrs=attrs)


def H(local: str, *children: Node) -> El:
    return el(ns.HPWSN, local, *children)


def render(node: Node, scope: dict[str | None, str | None] | None = None) -> str:
    scope = scope if scope is not None else {}
    if isinstance(node, Raw):
        return str(node)
    if isinstance(node, str):
        return escape(node)
    inner = dict(scope)
    decls = ""
    if node.declare and node.namespace is not None and scope.get(node.prefix) != node.namespace:
        decls = f" xmlns{':' + node.prefix if node.prefix else ''}={quoteattr(node.namespace)}"
        inner[node.prefix] = node.namespace
    elif node.declare and node.namespace is None and node.prefix is None and scope.get(None):
        decls = ' xmlns=""'
        inner[None] = None
    name = f"{node.prefix}:{node.local}" if node.prefix else node.local
    attrs = "".join(f" {k}={quoteattr(v)}" for k, v in node.attrs)
    if not node.children:
        return f"<{name}{decls}{attrs}/>"
    body = "".join(render(c, inner) for c in node.children)
    return f"<{name}{decls}{attrs}>{body}</{name}>"


Path = tuple[int, ...]


def paths(node: Node, at: Path = ()) -> Iterator[Path]:
    yield at
    if isinstance(node, El):
        for i, child in enumerate(node.children):
            yield from paths(child, (*at, i))


def node_at(root: Node, at: Path) -> Node:
    for i in at:
        assert isinstance(root, El)
        root = root.children[i]
    return root


def replace_at(root: Node, at: Path, new: tuple[Node, ...]) -> Node:
    """`root` with the node at `at` replaced by `new` (nothing: removed; several: spliced)."""
    if not at:
        return new[0] if new else ""
    assert isinstance(root, El)
    i, rest = at[0], at[1:]
    kids = list(root.children)
    if rest:
        kids[i] = replace_at(kids[i], rest, new)
    else:
        kids[i : i + 1] = new
    return dataclasses.replace(root, children=tuple(kids))


# ----------------------------------------------------------------------------- odd values

# NUL-free unicode, surrogates excluded (they cannot be encoded); control characters included.
ANY_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
# What XML 1.0 can carry.
XML_TEXT = st.text(
    st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\ufffe\uffff")
    | st.sampled_from("\t\n\r <>&'\"")
)
# Numbers other scripts write (superscript, Arabic-Indic, fullwidth digits: str.isdigit() says
# yes to all, int() to some), numbers no column holds, durations and dates at and past the ends.
ODD_VALUES = [
    "", " ", ":", "::", "//", "*", ".", "-1", "0", "1e999", "9" * 40, "-" + "9" * 40, "\u00b2",
    "\u0661\u0662", "\uff11\uff12", "NaN", "true", "]]>", "x" * 3000, "\u200b", "\U0001f642" * 50,
    "%0", "$topic", "http://", "urn:", "\t\n", "P", "PT", "P-1D", "P1Y2M3DT4H5M6.7S",
    "P99999999999Y", "PT99999999999999999999S", "2000-01-01T00:00:00Z", "2999-12-31T23:59:59Z",
    "9999-12-31T23:59:59+14:00", "0001-01-01T00:00:00-14:00", "2026-02-30T00:00:00Z",
    "2026-01-01T24:00:00Z", "-2026-01-01T00:00:00Z",
]  # fmt: skip
ODD_TEXT = st.one_of(
    st.sampled_from(ODD_VALUES),
    XML_TEXT.filter(lambda t: len(t) <= 40),
    ANY_TEXT.filter(lambda t: len(t) <= 20),
)

TOPICS_OK = [
    "ALL", "ALL:ALARM", "ALL:ALARM:ALARM1", "ALL:ALARM:ALARM1:ALARM11:ALARM114", "ALL1", "ALL2",
    "Object:Food:Fruit:Apple", "Object:Tool", "Gated", "Fuzz:Made1", "Fuzz:Made2", "Fuzz:A:B",
]  # fmt: skip
TOPICS_UNKNOWN = ["Nope", "ALL:NOPE", "Nope:Deeper", "Object:Food:Fruit:Kiwi:Green"]
ODD_TOPICS = [
    "", " ", ":", "::", "ALL:", ":ALL", "ALL//ALARM", "//ALARM1", "*", "ALL/*", "ALL:*", "tns:",
    "tns:ALL", "undeclared:ALL", "ALL/ALARM", ".", "ALL//.", "T" * 300, "ALL:" + "A:" * 40 + "B",
    "Ünïcødé:топик", "ALL|Object", "1ALL", "-", "ALL\tALARM", "tns:ALL/ALARM//*", "tns:ALL/",
    "ALL ALARM", "a:b:c:d:e:f:g:h:i:j:k:l:m:n:o:p:q:r", "tns:*", "tns:ALL|tns:ALL1", "ALL::ALARM",
]  # fmt: skip
DIALECTS = [ns.DIALECT_SIMPLE, ns.DIALECT_CONCRETE, ns.DIALECT_FULL, ns.DIALECT_COLON]
ODD_DIALECTS = ["", "urn:unknown:dialect", ns.DIALECT_SIMPLE.upper(), ns.DIALECT_SIMPLE + " "]


@st.composite
def topic_expression(
    draw: st.DrawFn, *, subscribe: bool
) -> tuple[str, tuple[tuple[str, str], ...]]:
    """A topic expression's text and its element's attributes (Dialect, namespace declarations)."""
    kind = draw(
        st.sampled_from(
            ["colon"] * 8 + ["unknown", "qualified", "qualified", "rooted", "odd", "random"]
        )
    )
    attrs: list[tuple[str, str]] = []
    if kind in ("colon", "unknown"):
        text = draw(st.sampled_from(TOPICS_OK if kind == "colon" else TOPICS_UNKNOWN))
        dialect = draw(st.sampled_from([ns.DIALECT_SIMPLE, ns.DIALECT_COLON, ns.DIALECT_CONCRETE]))
    elif (
        kind == "qualified"
    ):  # tns:ALL/ALARM, with tns declared (any namespace: demo roots have none)
        path = draw(st.sampled_from(TOPICS_OK * 3 + TOPICS_UNKNOWN)).split(":")
        sep = draw(st.sampled_from(["/", "//"])) if subscribe else "/"
        tail = draw(st.sampled_from(["", "/*", "//*", "//."])) if subscribe else ""
        text = "tns:" + sep.join(path) + tail
        dialect = ns.DIALECT_FULL if ("//" in text or "*" in text) else ns.DIALECT_CONCRETE
        if len(path) == 1 and draw(st.booleans()):
            dialect = ns.DIALECT_SIMPLE
        attrs.append(("xmlns:tns", draw(st.sampled_from(["urn:any", ROOT_NS]))))
    elif kind == "rooted":  # the root that declares a namespace
        text = draw(st.sampled_from(["r:NSRoot", "r:NSRoot/Kid", "r:NSRoot/Nope", "r:NSRoot//*"]))
        dialect = ns.DIALECT_FULL if "*" in text else ns.DIALECT_CONCRETE
        attrs.append(("xmlns:r", draw(st.sampled_from([ROOT_NS, ROOT_NS, "urn:other", ""]))))
    elif kind == "odd":
        text = draw(st.sampled_from(ODD_TOPICS))
        dialect = draw(st.sampled_from(DIALECTS + ODD_DIALECTS))
        if draw(st.booleans()):
            attrs.append(("xmlns:tns", "urn:any"))
    else:
        text = draw(ODD_TEXT)
        dialect = draw(st.sampled_from(DIALECTS + ODD_DIALECTS))
    if draw(st.integers(0, 9)):
        attrs.insert(0, ("Dialect", dialect))
    return text, tuple(attrs)


ADDRESSES_OK = [f"http://127.0.0.1:9/fuzz-{i}" for i in range(3)] + ["http://[::1]:9/fuzz"]
ODD_ADDRESSES = [
    "", "not a url", "ftp://127.0.0.1/x", "http://", "http://127.0.0.1:99999/x",
    "http://127.0.0.1:8000/wsn/", "http://localhost:8000/wsn/pullpoints/x", "http://169.254.169.254/",
    "http://10.0.0.1/x", "http://127.0.0.1:9/a\r\nX-Evil: 1", "http://127.0.0.1:9/a b",
    "http://" + "a" * 64 + ".invalid/", "http://" + "a." * 130 + "invalid/", "javascript:alert(1)",
    "http://[::1", "http://127.0.0.1:-1/", "http://0.0.0.0:9/", "http://224.0.0.1/",
    "urn:hpwsn:federation:x", "http://user:pass@127.0.0.1:9/",
]  # fmt: skip
ADDRESS = st.one_of(
    st.sampled_from(ADDRESSES_OK),
    st.sampled_from(ADDRESSES_OK),
    st.sampled_from(ODD_ADDRESSES),
    st.just("{{PP}}"),  # a live pull point of this broker
)
TIMES = st.sampled_from(["PT1H", "P1D", "PT30S", "2999-01-01T00:00:00Z", "P1Y"] * 3) | ODD_TEXT
XPATHS = [
    "boolean(//*)", "count(/*) > 0", "//*[local-name()='m']", "true()", "false()", "string(.)",
    "", "(", "//*[", "re:test(., 'a')", "$x", "count(//*[count(following::*) > 0]) > 0",
    "../*", "x" * 1100, "str:padding(10000000, 'a')", "1 div 0", "/*/@a = 'b'", "*:m",
    "unknownprefix:m", "string-length(.) > 1", "//.//..//.",
]  # fmt: skip
SQLS = [
    "$topic = 'ALL'", "$producer LIKE 'http%'", "$topic IN ('ALL', 'ALL1')", "", "$topic =",
    "$nope = 1", "%0 = $topic", "1 = 1", "$topic = %99", "body.x > 3", "NOT NOT NOT $topic",
]  # fmt: skip


@st.composite
def payload(draw: st.DrawFn) -> tuple[Node, ...]:
    kind = draw(st.sampled_from(["element", "element", "text", "empty", "several", "odd"]))
    if kind == "element":
        attrs = [("a", draw(XML_TEXT.filter(lambda t: len(t) < 20)))] if draw(st.booleans()) else []
        text = draw(XML_TEXT.filter(lambda t: len(t) < 60))
        return (El("urn:hpwsn:test:payload", "m", "d", tuple(attrs), (text,) if text else ()),)
    if kind == "text":
        return (draw(XML_TEXT.filter(lambda t: 0 < len(t) < 60)),)
    if kind == "empty":
        return ()
    if kind == "several":
        return tuple(El(None, f"v{i}", None, (), (str(i),)) for i in range(draw(st.integers(2, 4))))
    return (
        El(
            "urn:hpwsn:test:payload",
            "m",
            "d",
            (("xmlns:xsi", ns.XSI), ("xsi:type", "d:kind")),
            ("typed",),
        ),
        el(ns.XSI, "nil"),
    )


@st.composite
def notification_message(draw: st.DrawFn) -> El:
    text, attrs = draw(topic_expression(subscribe=False))
    parts: list[Node] = [W("Topic", text, attrs=attrs)]
    producer = draw(st.sampled_from([None, None, PUBLISHER, "http://127.0.0.1:9/other"]))
    if producer is not None:
        parts.append(W("ProducerReference", A("Address", producer)))
    if not draw(st.integers(0, 14)):
        flags = draw(st.sampled_from(["0-0-0-0", "1-1-0-0", "1-0-1-5", "x", "1-1-1-999999", ""]))
        parts.append(
            W("Package", El(None, "Identification", children=(draw(ODD_TEXT),)),
              El(None, "Fragment", children=(flags,)))
        )  # fmt: skip
    parts.append(W("Message", *draw(payload())))
    return W("NotificationMessage", *parts)


def to_header(target: str) -> El:
    return A("To", target)


@st.composite
def addressed(draw: st.DrawFn, kind: str, live: str) -> tuple[str, list[El]]:
    """Where a request to a resource of `kind` goes: (URL path, headers naming it)."""
    how = draw(st.sampled_from(["path", "to", "to", "refparam", "nothing"]))
    rid = draw(
        st.sampled_from([f"{{{{{live}ID}}}}"] * 4 + [str(uuid.UUID(int=0)), "x", "%00", "a" * 128])
    )
    if how == "path":
        return f"/wsn/{kind}/{rid}", []
    if how == "to":
        return "/wsn/", [to_header(f"{BASE}/wsn/{kind}/{rid}")]
    if how == "refparam":
        name = "SubscriptionId" if kind == "subscriptions" else "PullPointId"
        return "/wsn/", [H(name, rid)]
    return "/wsn/", []


@st.composite
def operation(draw: st.DrawFn) -> tuple[str, El, list[El]]:
    """A valid request of one operation: (URL path, body element, header blocks)."""
    op = draw(
        st.sampled_from(
            ["Notify"] * 6 + ["Subscribe"] * 4 + [
                "Renew", "Unsubscribe", "PauseSubscription", "ResumeSubscription",
                "GetCurrentMessage", "CreatePullPoint", "GetMessages", "DestroyPullPoint",
                "RegisterPublisher", "DestroyRegistration", "Legacy", "Legacy",
            ]
        )
    )  # fmt: skip
    if op == "Notify":
        return "/wsn/", notify_body(draw), []
    if op == "Subscribe":
        return "/wsn/", subscribe_body(draw), []
    if op in ("Renew", "Unsubscribe", "PauseSubscription", "ResumeSubscription"):
        path, headers = draw(addressed("subscriptions", "SUB"))
        kids: list[Node] = []
        if op == "Renew":
            kids = [W("TerminationTime", draw(TIMES))]
            if not draw(st.integers(0, 4)):
                path, headers = draw(addressed("registrations", "REG"))
        return path, W(op, *kids), headers
    if op == "GetCurrentMessage":
        text, attrs = draw(topic_expression(subscribe=False))
        return "/wsn/", W(op, W("Topic", text, attrs=attrs)), []
    if op == "CreatePullPoint":
        return "/wsn/", W(op), []
    if op in ("GetMessages", "DestroyPullPoint"):
        path, headers = draw(addressed("pullpoints", "PP"))
        kids = []
        if op == "GetMessages" and draw(st.booleans()):
            kids = [W("MaximumNumber", draw(st.sampled_from(["1", "5", "0"]) | ODD_TEXT))]
        return path, W(op, *kids), headers
    if op == "RegisterPublisher":
        return "/wsn/", register_body(draw), []
    if op == "DestroyRegistration":
        path, headers = draw(addressed("registrations", "REG"))
        return path, BR(op), headers
    inner = draw(st.sampled_from(["Notify", "NotificationMessage", "Subscribe", "CreatePullPoint"]))
    body = {
        "Notify": lambda: notify_body(draw),
        "NotificationMessage": lambda: draw(notification_message()),
        "Subscribe": lambda: subscribe_body(draw),
        "CreatePullPoint": lambda: W("CreatePullPoint"),
    }[inner]()
    if draw(st.booleans()):  # the inner message as an XML string parameter (figure 5-4)
        param: Node = el(ns.LEGACY, "message", render(body))
    else:
        param = body
    return "/wsn/", el(ns.LEGACY, "WsnProcess", param), []


def notify_body(draw: st.DrawFn) -> El:
    messages = draw(st.lists(notification_message(), min_size=1, max_size=4))
    return W("Notify", *messages)


def subscribe_body(draw: st.DrawFn) -> El:
    kids: list[Node] = [W("ConsumerReference", A("Address", draw(ADDRESS)))]
    filters: list[Node] = []
    if draw(st.integers(0, 5)):
        text, attrs = draw(topic_expression(subscribe=True))
        filters.append(W("TopicExpression", text, attrs=attrs))
    if not draw(st.integers(0, 3)):
        dialect = draw(st.sampled_from([ns.FILTER_XPATH, sqlfilter.DIALECT, "urn:unknown", ""]))
        text = draw(st.sampled_from(XPATHS + SQLS) | ODD_TEXT)
        filters.append(W("MessageContent", text, attrs=[("Dialect", dialect)]))
    if not draw(st.integers(0, 5)):
        dialect = draw(st.sampled_from([sqlfilter.DIALECT, ns.FILTER_XPATH, "urn:unknown"]))
        text = draw(st.sampled_from(SQLS) | ODD_TEXT)
        filters.append(W("ProducerProperties", text, attrs=[("Dialect", dialect)]))
    if filters or not draw(st.integers(0, 3)):
        kids.append(W("Filter", *filters))
    if draw(st.booleans()):
        kids.append(W("InitialTerminationTime", draw(TIMES)))
    if not draw(st.integers(0, 4)):
        policy = draw(
            st.lists(
                st.sampled_from(
                    [
                        W("UseRaw"), H("Format", "wsn"), H("Format", "cloudevents"),
                        H("Format", "xml"), H("SigningSecret", "s3cret"),
                        H("SigningSecret", "whsec_!!!"), W("SomethingElse"),
                        H("FilterParameters", H("Parameter", "ALL")),
                        H("InterestPath", H("Site", "a"), H("Site", "a")), H("Peers"),
                    ]
                ),
                max_size=3,
            )
        )  # fmt: skip
        kids.append(W("SubscriptionPolicy", *policy))
    if not draw(st.integers(0, 9)):
        kids.append(W("SubscriberAddress", draw(ADDRESS)))
    return W("Subscribe", *kids)


def register_body(draw: st.DrawFn) -> El:
    kids: list[Node] = []
    if draw(st.integers(0, 5)):
        address = draw(
            st.sampled_from([PUBLISHER, "http://127.0.0.1:9/pub2"]) | st.just("") | ADDRESS
        )
        kids.append(BR("PublisherReference", A("Address", address)))
    for _ in range(draw(st.integers(0, 2))):
        text, attrs = draw(topic_expression(subscribe=False))
        kids.append(BR("Topic", text, attrs=attrs))
    if draw(st.booleans()):
        kids.append(BR("Demand", draw(st.sampled_from(["false", "true", "0", "1"]) | ODD_TEXT)))
    if draw(st.booleans()):
        kids.append(BR("InitialTerminationTime", draw(TIMES)))
    return BR("RegisterPublisher", *kids)


# ----------------------------------------------------------------------------- mutations

WRONG_NAMESPACES = [
    None, "urn:wrong", ns.WSNT, ns.WSNBR, ns.WSA, ns.SOAP11, ns.SOAP12, ns.LEGACY, ns.WSNT + "/",
    "http://docs.oasis-open.org/wsn/b-1", ns.HPWSN,
]  # fmt: skip
GARBAGE_ATTRS = [
    "Dialect", "s:mustUnderstand", "xsi:nil", "foo", "wsa:IsReferenceParameter", "xml:lang",
    "xmlns:tns", "xmlns", "s:encodingStyle",
]  # fmt: skip


@st.composite
def mutated(draw: st.DrawFn, root: El, *, most: int, malformed: bool) -> El:
    """`root` after up to `most` mutations; with `malformed`, also those that break the XML."""
    kinds = ["drop", "duplicate", "reorder", "namespace", "to_text", "text", "attribute", "insert"]
    if malformed:
        kinds += ["prefix", "raw"]
    for _ in range(draw(st.integers(1, most))):
        spots = list(paths(root))
        at = spots[draw(st.integers(0, len(spots) - 1))]
        node = node_at(root, at)
        kind = draw(st.sampled_from(kinds))
        if not at and kind in ("drop", "duplicate", "to_text"):
            continue
        if kind == "drop":
            new: tuple[Node, ...] = ()
        elif kind == "duplicate":
            new = (node, node)
        elif kind == "reorder" and isinstance(node, El) and len(node.children) > 1:
            kids = draw(st.permutations(node.children))
            new = (dataclasses.replace(node, children=tuple(kids)),)
        elif kind == "namespace" and isinstance(node, El):
            namespace = draw(st.sampled_from(WRONG_NAMESPACES))
            prefix = (PREFIXES.get(namespace) or "q") if namespace else None
            if namespace in (ns.SOAP11, ns.SOAP12):
                prefix = "e"  # not "s": the envelope's prefix stays bound to the envelope
            new = (dataclasses.replace(node, namespace=namespace, prefix=prefix),)
        elif kind == "prefix" and isinstance(node, El):
            prefix = draw(st.sampled_from(["undeclared", "xml", "xmlns", "", "s", "wsnt"]))
            new = (dataclasses.replace(node, prefix=prefix or None, declare=False),)
        elif kind == "to_text":
            new = (draw(ODD_TEXT),)
        elif kind == "text" and isinstance(node, El):
            new = (dataclasses.replace(node, children=(draw(ODD_TEXT),)),)
        elif kind == "attribute" and isinstance(node, El):
            attr = (draw(st.sampled_from(GARBAGE_ATTRS)), draw(ODD_TEXT))
            new = (dataclasses.replace(node, attrs=(*node.attrs, attr)),)
        elif kind == "insert" and isinstance(node, El):
            extra = el(
                draw(st.sampled_from(WRONG_NAMESPACES)),
                draw(
                    st.sampled_from(
                        ["Topic", "Message", "NotificationMessage", "Filter", "Address", "x"]
                    )
                ),
            )
            pos = draw(st.integers(0, len(node.children)))
            kids = list(node.children)
            kids.insert(pos, extra)
            new = (dataclasses.replace(node, children=tuple(kids)),)
        elif kind == "raw" and isinstance(node, El):
            raw = draw(
                st.sampled_from(
                    [
                        "<![CDATA[x]]>",
                        "<!-- c -->",
                        "<?pi x?>",
                        "&amp;",
                        "&nope;",
                        "&#0;",
                        "&#x1F600;",
                        "<",
                        "]]>",
                        "<a:b/>",
                        "</wsnt:Notify>",
                        "<x>",
                    ]
                )
            )
            new = (dataclasses.replace(node, children=(*node.children, Raw(raw))),)
        else:
            continue
        replaced = replace_at(root, at, new)
        if isinstance(replaced, El):
            root = replaced
    return root


# ----------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class Request:
    path: str
    ctype: str | None
    text: str  # the document, with placeholders ({{MID}}, {{SUB}}, ...) for what only a run has
    encoding: str = "utf-8"
    byte_ops: tuple[tuple[str, float, str], ...] = ()  # (truncate|insert, where 0..1, what)
    authorization: str | None = None
    declared_length: int | None = None  # a Content-Length other than the body's


CONTENT_TYPES = [
    CT11, CT12, "text/xml", "application/soap+xml", None, "", "application/json",
    "text/plain", "TEXT/XML; charset=UTF-8", "Application/Soap+XML; charset=utf-8",
    "text/xml; charset=latin-1", "application/soap+xml; charset=utf-16",
    'application/soap+xml; charset="utf-8"; action="urn:x"', "text/xml;charset=utf-8;",
    "multipart/related; type=application/xop+xml", "application/soap+xml-x",
]  # fmt: skip


@st.composite
def headers(draw: st.DrawFn, env_prefix: str, *, hostile: bool) -> list[El]:
    blocks: list[El] = []
    if draw(st.integers(0, 3)):
        blocks.append(A("MessageID", "urn:uuid:{{MID}}"))
    if not draw(st.integers(0, 3)):
        blocks.append(A("Action", draw(st.sampled_from([ns.ACTION_NOTIFY, "urn:odd"]) | ODD_TEXT)))
    if not hostile:
        return blocks
    if not draw(st.integers(0, 5)):
        flag = draw(st.sampled_from(["1", "true", "0", "false", " 1", "yes"]))
        namespace = draw(st.sampled_from(["urn:unknown:header", ns.WSA, ns.HPWSN, ns.WSSE]))
        block = el(namespace, "Extra", "x")
        blocks.append(dataclasses.replace(block, attrs=((f"{env_prefix}:mustUnderstand", flag),)))
    if not draw(st.integers(0, 9)):
        token = el(
            ns.WSSE, "UsernameToken", el(ns.WSSE, "Username", draw(ODD_TEXT)),
            el(ns.WSSE, "Password", draw(ODD_TEXT)),
        )  # fmt: skip
        blocks.append(
            el(ns.WSSE, "Security", *draw(st.sampled_from([(token,), (), (token, token)])))
        )
    return blocks


@st.composite
def requests(draw: st.DrawFn) -> Request:
    """A request of some operation: valid (two in five), with a few mutations that keep the XML
    well-formed (one in three), or hostile at every level, the transport's included."""
    path, body, op_headers = draw(operation())
    version = draw(st.sampled_from(["1.1", "1.2"]))
    level = draw(st.sampled_from([0] * 6 + [1] * 5 + [2] * 4))
    env_ns = ENV_NS[version]
    blocks = op_headers + draw(headers("s", hostile=level > 0))
    envelope_kids: list[Node] = []
    if blocks or draw(st.booleans()):
        envelope_kids.append(El(env_ns, "Header", "s", (), tuple(blocks)))
    envelope_kids.append(El(env_ns, "Body", "s", (), (body,)))
    root = El(env_ns, "Envelope", "s", (), tuple(envelope_kids))
    ctype = CT11 if version == "1.1" else CT12
    if level == 1:
        root = draw(mutated(root, most=2, malformed=False))
    text = render(root)
    if level < 2:
        return Request(path, ctype, text)

    root = draw(mutated(root, most=4, malformed=True))
    text = render(root)
    size = draw(st.integers(0, 11))
    if size == 0:  # over the size limit
        text = text.replace("</s:Body>", "<x>" + "y" * LIMIT + "</x></s:Body>", 1)
    elif size == 1:  # over the depth limit
        text = text.replace("</s:Body>", "<d>" * 70 + "</d>" * 70 + "</s:Body>", 1)
    elif size == 2:  # over the namespace declarations limit
        decls = "".join(f' xmlns:n{i}="urn:n:{i}"' for i in range(300))
        text = text.replace("<s:Body", "<s:Body" + decls, 1)
    elif size == 3:  # over the attributes limit
        text = text.replace("<s:Body", "<s:Body" + "".join(f' a{i}="1"' for i in range(300)), 1)
    prolog = draw(
        st.sampled_from(
            ["", "", "", '<?xml version="1.0" encoding="utf-8"?>', '<?xml version="1.0"?>',
             '<?xml version="1.0" encoding="ISO-8859-1"?>', '<?xml version="1.1"?>', "\ufeff",
             '<?xml version="1.0" encoding="UTF-16"?>', " \n"]
        )
    )  # fmt: skip
    ctype = draw(st.sampled_from([ctype] * 4 + CONTENT_TYPES))
    encoding = draw(st.sampled_from(["utf-8"] * 6 + ["utf-16", "utf-16-le", "latin-1"]))
    byte_ops: list[tuple[str, float, str]] = []
    if not draw(st.integers(0, 4)):
        what = draw(st.sampled_from(["truncate", "insert"]))
        char = draw(ANY_TEXT.filter(lambda t: 0 < len(t) <= 3))
        byte_ops.append((what, draw(st.floats(0, 1)), char))
    auth = draw(st.sampled_from([None] * 6 + ["Basic !!!", "Basic dXNlcjpwYXNz", "Bearer x"]))
    declared = LIMIT + 1 if not draw(st.integers(0, 19)) else None
    return Request(path, ctype, prolog + text, encoding, tuple(byte_ops), auth, declared)


# ----------------------------------------------------------------------------- the broker


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class Snapshot:
    log_seq: int
    log_rows: int
    ingest: int
    accepted: int
    current: dict[str, bytes]
    subscriptions: int
    pull_points: int
    registrations: int
    topics: int


class Broker:
    """The ASGI route of /wsn/ over the test database and Redis, on one event loop."""

    def __init__(self, r: redis.Redis) -> None:
        async def django_app(scope: Any, receive: Any, send: Any) -> None:
            raise AssertionError(f"{scope['path']} went to Django, not to the SOAP route")

        self.app = wrap(django_app)
        self.loop = asyncio.new_event_loop()
        self.r = r
        self.registration = ""  # the address of a live publisher registration (for Gated)

    def post(
        self,
        path: str,
        body: bytes,
        ctype: str | None,
        authorization: str | None = None,
        declared_length: int | None = None,
    ) -> Answer:
        headers = [(b"host", HOST.encode())]
        if ctype is not None:
            headers.append((b"content-type", ctype.encode("latin-1")))
        length = declared_length if declared_length is not None else len(body)
        headers.append((b"content-length", str(length).encode()))
        if authorization is not None:
            headers.append((b"authorization", authorization.encode("latin-1")))
        scope = {
            "type": "http", "method": "POST", "path": path, "scheme": "http",
            "client": ("127.0.0.1", 40000), "headers": headers,
        }  # fmt: skip
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        self.loop.run_until_complete(self.app(scope, receive, send))
        start, done = sent
        answer_headers = {k.decode(): v.decode("latin-1") for k, v in start["headers"]}
        return Answer(int(start["status"]), answer_headers, bytes(done["body"]))

    def soap(self, body_xml: str, path: str = "/wsn/") -> etree._Element:
        """A valid SOAP 1.1 call that must succeed; the reply's Body element."""
        doc = (
            f'<s:Envelope xmlns:s="{ns.SOAP11}" xmlns:wsnt="{ns.WSNT}" xmlns:wsa="{ns.WSA}" '
            f'xmlns:wsnbr="{ns.WSNBR}"><s:Body>{body_xml}</s:Body></s:Envelope>'
        )
        answer = self.post(path, doc.encode(), CT11)
        assert answer.status == 200, answer.body[:2000]
        body = etree.fromstring(answer.body).find(f"{{{ns.SOAP11}}}Body")
        assert body is not None
        return body

    def live_subscription(self) -> str:
        body = self.soap(
            "<wsnt:Subscribe><wsnt:ConsumerReference><wsa:Address>http://127.0.0.1:9/fuzz-live"
            f'</wsa:Address></wsnt:ConsumerReference><wsnt:Filter><wsnt:TopicExpression Dialect="'
            f'{ns.DIALECT_SIMPLE}">ALL1</wsnt:TopicExpression></wsnt:Filter></wsnt:Subscribe>'
        )
        return address_in(body)

    def live_pull_point(self) -> str:
        return address_in(self.soap("<wsnt:CreatePullPoint/>"))

    def live_registration(self) -> str:
        body = self.soap(
            f"<wsnbr:RegisterPublisher><wsnbr:PublisherReference><wsa:Address>{PUBLISHER}"
            "</wsa:Address></wsnbr:PublisherReference><wsnbr:Topic "
            f'Dialect="{ns.DIALECT_SIMPLE}">Gated</wsnbr:Topic></wsnbr:RegisterPublisher>'
        )
        return address_in(body)

    def snapshot(self) -> Snapshot:
        current = {
            k.decode(): bytes(self.r.get(k) or b"")
            for k in self.r.scan_iter(f"{state.PREFIX}cur:*")
        }
        last = StoredMessage.objects.order_by("-seq").values_list("seq", flat=True).first()
        return Snapshot(
            log_seq=last or 0,
            log_rows=StoredMessage.objects.count(),
            ingest=int(self.r.llen(state.INGEST)),
            accepted=int(self.r.hget(STATS, "accepted") or 0),
            current=current,
            subscriptions=Subscription.objects.count(),
            pull_points=PullPoint.objects.count(),
            registrations=PublisherRegistration.objects.count(),
            topics=Topic.objects.count(),
        )

    def stored_since(self, before: Snapshot) -> list[bytes]:
        """The payloads stored (database log and Redis) since `before`."""
        rows = StoredMessage.objects.filter(seq__gt=before.log_seq).order_by("seq")
        payloads = [bytes(p) for p in rows.values_list("payload", flat=True)]
        for item in self.r.lrange(state.INGEST, before.ingest, -1):
            nid = item.split(b"|", 1)[0].decode()
            payloads.append(bytes(self.r.get(state.payload_key(nid)) or b""))
        return payloads


def address_in(body: etree._Element) -> str:
    found = body.findtext(f".//{{{ns.WSA}}}Address")
    assert found
    return found.strip()


@pytest.fixture
def broker(transactional_db, settings, caplog):  # type: ignore[no-untyped-def]
    """The route of /wsn/ over the demo topics plus a few of the fuzz's own (a root that makes
    its children on publish, one that takes registered publishers only, one with a namespace,
    a fast subtree)."""
    settings.HPWSN_MAX_REQUEST_BYTES = LIMIT
    settings.HPWSN_PUBLIC_URL = ""
    settings.HPWSN_HTTP_PORT = 8000
    settings.HPWSN_LDAP_URL = ""  # credentials cannot be checked: refused, never looked up
    db_index = urlsplit(settings.REDIS_URL).path.strip("/") or "0"
    if db_index == "0":
        pytest.skip("the fuzz flushes its Redis database: set REDIS_URL to a spare one")
    r = redis.Redis.from_url(settings.REDIS_URL)
    r.flushdb()
    topics_load_demo()
    for path in ("Fuzz", "Gated", "Fuzz:A:B"):
        topic_create(path=path)
    topic_create(path="NSRoot:Kid", namespace=ROOT_NS)
    open_ = {"anonymous_publish": True, "anonymous_subscribe": True}
    Topic.objects.filter(path__in=["Fuzz", "Gated", "NSRoot"]).update(**open_)
    Topic.objects.filter(path="Fuzz").update(auto_create_children=True)
    Topic.objects.filter(path="Gated").update(require_registration=True)
    Topic.objects.filter(path="Object").update(reliability="fast")
    state.bump(state.VERSION_TOPICS)
    caplog.set_level(logging.INFO)
    b = Broker(r)
    b.registration = b.live_registration()
    yield b
    b.loop.close()


# ----------------------------------------------------------------------------- the oracle


def media_of(ctype: str | None) -> str:
    return (ctype or "").split(";", 1)[0].strip().lower()


def version_of(ctype: str | None) -> str:
    """The SOAP version a Content-Type names: by its media type, in any case."""
    return "1.2" if media_of(ctype) == "application/soap+xml" else "1.1"


def parsed(data: bytes, ctype: str | None, settings: Any) -> etree._Element | None:
    try:
        return parse_hardened(
            data,
            max_bytes=settings.HPWSN_MAX_REQUEST_BYTES,
            max_depth=settings.HPWSN_MAX_XML_DEPTH,
            charset=charset_of(ctype),
            max_namespaces=settings.HPWSN_MAX_XML_NAMESPACES,
            max_attributes=settings.HPWSN_MAX_XML_ATTRIBUTES,
        )
    except XMLRejected:
        return None


def spoken_version(root: etree._Element | None, ctype: str | None) -> str | None:
    """The version the answer must be in; None when either is right (a media type that is not
    SOAP's)."""
    media = media_of(ctype)
    if media and media not in ("text/xml", "application/soap+xml"):
        return None
    if root is not None and root.tag == f"{{{ns.SOAP12}}}Envelope":
        return "1.2"
    if root is not None and root.tag == f"{{{ns.SOAP11}}}Envelope":
        return "1.2" if media == "application/soap+xml" else "1.1"  # 1.2: VersionMismatch
    return version_of(ctype)


def operation_of(root: etree._Element | None, settings: Any) -> etree._Element | None:
    """The operation element the endpoint dispatches on (inside WsnProcess for legacy calls)."""
    if root is None or root.tag not in (f"{{{v}}}Envelope" for v in (ns.SOAP11, ns.SOAP12)):
        return None
    body = next((c for c in root if c.tag == f"{{{etree.QName(root).namespace}}}Body"), None)
    first = next((c for c in body if isinstance(c.tag, str)), None) if body is not None else None
    if first is None or first.tag != f"{{{ns.LEGACY}}}WsnProcess":
        return first
    for child in first:
        if not isinstance(child.tag, str):
            continue
        if etree.QName(child).namespace == ns.WSNT:
            return child
        text = (child.text or "").strip()
        if text.startswith("<"):
            return parsed(text.encode(), None, settings)
    return None


def shape(element: etree._Element) -> Any:
    """An element's names, attributes and text, and its children's, in order: what a message
    says, without the namespace declarations the broker leaves out (and which C14N refuses when
    they are relative URIs)."""
    return (
        element.tag,
        tuple(sorted(element.attrib.items())),
        element.text or "",
        tuple((shape(c), c.tail or "") for c in element if isinstance(c.tag, str)),
    )


def sent_messages(operation: etree._Element | None) -> list[Any] | None:
    """The wsnt:Message of each message a Notify (or a bare legacy NotificationMessage) carries;
    None if the operation publishes nothing."""
    if operation is None:
        return None
    if operation.tag == f"{{{ns.WSNT}}}Notify":
        messages = [c for c in operation if c.tag == f"{{{ns.WSNT}}}NotificationMessage"]
    elif operation.tag == f"{{{ns.WSNT}}}NotificationMessage":
        messages = [operation]
    else:
        return None
    out = []
    for m in messages:
        found = m.find(f"{{{ns.WSNT}}}Message")
        if found is not None:
            out.append(shape(found))
    return out


def stored_messages(payloads: list[bytes]) -> list[Any]:
    out = []
    for payload in payloads:
        holder = etree.fromstring(b"<w>" + payload + b"</w>")
        out += [shape(m) for m in holder if m.tag == f"{{{ns.WSNT}}}Message"]
    return out


def fault_of(answer: Answer, version: str) -> tuple[str, str]:
    """(code, reason) of a fault answer, checked to be a SOAP fault envelope of `version`."""
    env = ENV_NS[version]
    root = parse_hardened(answer.body, max_bytes=10 * LIMIT + len(answer.body), max_depth=64)
    assert root.tag == f"{{{env}}}Envelope", (version, answer.body[:600])
    fault = root.find(f"{{{env}}}Body/{{{env}}}Fault")
    assert fault is not None, answer.body[:600]
    if version == "1.1":
        return (fault.findtext("faultcode") or "").strip(), fault.findtext("faultstring") or ""
    code = fault.findtext(f"{{{env}}}Code/{{{env}}}Value") or ""
    reason = fault.findtext(f"{{{env}}}Reason/{{{env}}}Text") or ""
    return code.strip(), reason


def materialise(req: Request, broker: Broker) -> tuple[str, bytes]:
    """The request's path and bytes, its placeholders filled with what exists in this run."""
    text, path = req.text, req.path
    values: dict[str, Callable[[], str]] = {
        "MID": lambda: str(uuid.uuid4()),
        "SUB": broker.live_subscription,
        "PP": broker.live_pull_point,
        "REG": lambda: broker.registration,
    }
    for name, make in values.items():
        if f"{{{{{name}" in text or f"{{{{{name}" in path:
            value = make()
            rid = value.rstrip("/").rsplit("/", 1)[-1]
            if name == "REG" and not PublisherRegistration.objects.filter(pk=rid).exists():
                value = broker.registration = broker.live_registration()
                rid = value.rstrip("/").rsplit("/", 1)[-1]
            for key, fill in ((f"{{{{{name}ID}}}}", rid), (f"{{{{{name}}}}}", value)):
                text, path = text.replace(key, fill), path.replace(key, fill)
    try:
        data = text.encode(req.encoding)
    except UnicodeEncodeError:
        data = text.encode("utf-8")
    for what, where, char in req.byte_ops:
        at = int(where * len(data))
        data = data[:at] if what == "truncate" else data[:at] + char.encode() + data[at:]
    return path, data


def _repeated(root: etree._Element | None, before: Snapshot) -> bool:
    """Whether the request's wsa:MessageID (its idempotency key, anonymous) was stored before."""
    mid = root.findtext(f".//{{{ns.WSA}}}MessageID") if root is not None else None
    if not mid:
        return False
    # As the edge keys an anonymous caller's messages (the broker's calls come from 127.0.0.1).
    key = publish_key(ANONYMOUS, mid.strip(), client="127.0.0.1")
    assert key is not None
    if len(key) > 250:
        key = hashlib.sha256(key.encode()).hexdigest()
    stored = StoredMessage.objects.filter(
        idempotency_key__startswith=f"{key}#", seq__lte=before.log_seq
    )
    return stored.exists()


def exchange_checked(req: Request, broker: Broker, caplog: Any, settings: Any) -> Answer:
    path, data = materialise(req, broker)
    too_large = req.declared_length is not None or len(data) > LIMIT
    root = None if too_large else parsed(data, req.ctype, settings)
    op = operation_of(root, settings)
    before = broker.snapshot()
    caplog.clear()
    answer = broker.post(path, data, req.ctype, req.authorization, req.declared_length)
    after = broker.snapshot()
    event(f"{etree.QName(op).localname if op is not None else '-'} -> {answer.status}")

    unexpected = [r for r in caplog.records if UNEXPECTED in r.getMessage()]
    assert not unexpected, caplog.text[-4000:]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, caplog.text[-4000:]
    version = spoken_version(root, req.ctype)
    if too_large:
        assert answer.status == 413, (answer.status, answer.body[:600])

    if answer.status == 202:
        assert answer.body == b""
        assert op is not None
        assert op.tag == f"{{{ns.WSNT}}}Notify", answer.status
    elif answer.status == 200:
        assert version is not None
        reply_root = parse_hardened(answer.body, max_bytes=100 * LIMIT, max_depth=64)
        env = ENV_NS[version]
        assert reply_root.tag == f"{{{env}}}Envelope", (version, answer.body[:600])
        reply = next(iter(reply_root.find(f"{{{env}}}Body")))
        assert op is not None
        request_el = next(iter(root.find(f"{{{env}}}Body")))  # type: ignore[union-attr]
        if request_el.tag == f"{{{ns.LEGACY}}}WsnProcess":
            assert reply.tag == f"{{{ns.LEGACY}}}WsnProcessResponse", answer.body[:600]
            inner = reply.findtext("return") or ""
            if inner != "accepted":
                etree.fromstring(inner.encode())
        else:
            assert etree.QName(reply).localname == etree.QName(op).localname + "Response", (
                answer.body[:600]
            )
    else:
        assert answer.status in FAULT_STATUSES, (answer.status, answer.body[:600])
        versions = [version] if version else ["1.1", "1.2"]
        env_found = etree.fromstring(answer.body).tag
        assert env_found in (f"{{{ENV_NS[v]}}}Envelope" for v in versions), (
            versions, answer.body[:600], data[:600]
        )  # fmt: skip
        answered = "1.2" if env_found == f"{{{ns.SOAP12}}}Envelope" else "1.1"
        code, reason = fault_of(answer, answered)
        assert INTERNAL not in reason, (data[:2000], answer.body[:2000])
        if op is not None:
            gist = re.sub(r"[0-9a-f-]{8,}|'.*?'", "_", reason)[:70]
            event(f"{etree.QName(op).localname}: {gist}")
        if answered == "1.2" and answer.status not in (401, 413, 415, 503):
            assert (answer.status == 400) == code.endswith("Sender"), (answer.status, code)
        # A refused request changes nothing, the topics a Notify would create included.
        assert after == before, (data[:2000], answer.body[:1000], before, after)
        return answer

    published = sent_messages(op)
    if published is None or answer.status not in (200, 202):
        assert (after.log_rows, after.ingest, after.accepted) == (
            before.log_rows, before.ingest, before.accepted
        ), "an operation that publishes nothing stored messages"  # fmt: skip
        return answer
    stored = stored_messages(broker.stored_since(before))
    if b"Package" in data:  # a fragment may be held until its message is whole
        assert len(stored) <= len(published)
    elif not stored and published and _repeated(root, before):
        # A wsa:MessageID the log already holds: the repeat is answered and stored again never.
        assert after.log_rows == before.log_rows
    else:
        assert sorted(map(repr, stored)) == sorted(map(repr, published)), (data[:2000], stored)
        assert after.accepted - before.accepted == len(published)
    return answer


# ----------------------------------------------------------------------------- the tests

FUZZ = hypothesis_settings(
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)  # fmt: skip
# `make test` runs a bounded number of examples; --hypothesis-profile=long runs many more.
LONG = hypothesis_settings.get_current_profile_name() == "long"


def _notify(*messages: str, version: str = "1.1", header: str = "") -> str:
    env = ENV_NS[version]
    return (
        f'<s:Envelope xmlns:s="{env}" xmlns:wsnt="{ns.WSNT}" xmlns:wsa="{ns.WSA}">'
        f"<s:Header>{header}</s:Header><s:Body>"
        f"<wsnt:Notify>{''.join(messages)}</wsnt:Notify></s:Body></s:Envelope>"
    )


def _message(topic: str, content: str = "<d:m xmlns:d='urn:d'>1</d:m>", extra: str = "") -> str:
    return (
        f'<wsnt:NotificationMessage><wsnt:Topic Dialect="{ns.DIALECT_SIMPLE}">{topic}'
        f"</wsnt:Topic>{extra}<wsnt:Message>{content}</wsnt:Message></wsnt:NotificationMessage>"
    )


UNDERSTOOD_BY_NOBODY = '<x:H xmlns:x="urn:x" s:mustUnderstand="true"/>'


@hypothesis_settings(FUZZ, max_examples=5000 if LONG else 1200)
@given(req=requests())
# Media types are case-insensitive: this is a SOAP 1.2 request, not a VersionMismatch.
@example(req=Request("/wsn/", "Application/Soap+XML; charset=utf-8", _notify(version="1.2")))
@example(req=Request("/wsn/", "APPLICATION/SOAP+XML", _notify(_message("ALL1"), version="1.2")))
# A parameter that mentions the other media type names no version.
@example(req=Request("/wsn/", 'text/xml; action="urn:x:application/soap+xml"', _notify()))
# A SOAP 1.2 envelope sent as text/xml (or with no Content-Type) is answered in SOAP 1.2, its
# faults too: MustUnderstand, no Body, an empty Body.
@example(req=Request("/wsn/", "text/xml", _notify(version="1.2", header=UNDERSTOOD_BY_NOBODY)))
@example(req=Request("/wsn/", None, f'<s:Envelope xmlns:s="{ns.SOAP12}"></s:Envelope>'))
@example(
    req=Request("/wsn/", "text/xml", f'<s:Envelope xmlns:s="{ns.SOAP12}"><s:Body/></s:Envelope>')
)
def test_every_request_gets_a_precise_answer_and_a_refusal_stores_nothing(
    broker, caplog, settings, req
):
    exchange_checked(req, broker, caplog, settings)


@hypothesis_settings(FUZZ, max_examples=1000 if LONG else 250)
@given(
    messages=st.lists(
        st.tuples(st.sampled_from(TOPICS_OK[:8] + TOPICS_UNKNOWN[:1]), payload()),
        min_size=1,
        max_size=5,
    ),
    version=st.sampled_from(["1.1", "1.2"]),
)
def test_an_accepted_notify_stores_exactly_its_messages(
    broker, caplog, settings, messages, version
):
    text = _notify(
        *(_message(topic, "".join(render(p) for p in content)) for topic, content in messages),
        version=version,
    )
    answer = exchange_checked(
        Request("/wsn/", CT11 if version == "1.1" else CT12, text), broker, caplog, settings
    )
    unknown = any(topic in TOPICS_UNKNOWN for topic, _content in messages)
    assert answer.status == (202 if not unknown else 500 if version == "1.1" else 400), answer.body


def test_a_refused_notify_creates_no_topic(broker):
    """Its first message names a new child of a topic that makes children on publish, its second
    a topic that does not exist: the Notify is refused, and the child is not made."""
    before = Topic.objects.count()
    text = _notify(_message("Fuzz:Made1"), _message("Nope"))

    answer = broker.post("/wsn/", text.encode(), CT11)

    assert answer.status == 500
    assert b"TopicNotSupportedFault" in answer.body
    assert Topic.objects.count() == before, list(Topic.objects.filter(path__startswith="Fuzz:"))
