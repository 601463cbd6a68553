"""Request envelopes built the way a third-party zeep client builds them, in SOAP 1.1 and 1.2.

SOAP 1.1 uses the WSDL the broker serves at /wsn/?wsdl (CXF's concrete bindings over the OASIS port
types); SOAP 1.2 uses ONVIF's events.wsdl, the only WSN WSDL at hand with SOAP 1.2 bindings. zeep
renders the body (`binding._create`, which is what `client.service.X(...)` sends); the tests add
WS-Addressing headers, POST with httpx and read the reply with lxml, so that faults and HTTP
statuses stay observable instead of being turned into zeep exceptions.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import zeep
from lxml import etree
from zeep import xsd
from zeep.wsa import WSA
from zeep.wsdl.utils import get_or_create_header
from zeep.wsse.username import UsernameToken

from hpwsn import ns
from tests.support import NSMAP, SoapResult


def _schemas() -> Path:
    """The OASIS/ONVIF schemas beside the checkout (../shared), wherever the checkout lives."""
    if os.environ.get("HPWSN_WSN_SCHEMAS"):
        return Path(os.environ["HPWSN_WSN_SCHEMAS"])
    beside = Path(__file__).resolve().parents[3] / "shared" / "wsn-schemas"
    return beside if beside.is_dir() else Path("/work/shared/wsn-schemas")


SCHEMAS = _schemas()
ONVIF_EVENTS_WSDL = SCHEMAS / "onvif" / "events.wsdl"

CXF = "{http://cxf.apache.org/wsn/jaxws}"
ONVIF = "{http://www.onvif.org/ver10/events/wsdl}"
# Which binding of each WSDL carries an operation (and the WSN port type it belongs to, which gives
# the WS-Addressing default action when the WSDL names none).
BINDINGS: dict[str, dict[str, tuple[str, str]]] = {
    "1.1": {
        "Notify": (f"{CXF}NotificationBrokerSoap", "NotificationConsumer"),
        "Subscribe": (f"{CXF}NotificationBrokerSoap", "NotificationProducer"),
        "GetCurrentMessage": (f"{CXF}NotificationBrokerSoap", "NotificationProducer"),
        "Renew": (f"{CXF}PausableSubscriptionManagerSoap", "SubscriptionManager"),
        "Unsubscribe": (f"{CXF}PausableSubscriptionManagerSoap", "SubscriptionManager"),
        "PauseSubscription": (
            f"{CXF}PausableSubscriptionManagerSoap",
            "PausableSubscriptionManager",
        ),
        "ResumeSubscription": (
            f"{CXF}PausableSubscriptionManagerSoap",
            "PausableSubscriptionManager",
        ),
        "CreatePullPoint": (f"{CXF}CreatePullPointSoap", "CreatePullPoint"),
        "GetMessages": (f"{CXF}PullPointSoap", "PullPoint"),
        "DestroyPullPoint": (f"{CXF}PullPointSoap", "PullPoint"),
    },
    "1.2": {
        "Notify": (f"{ONVIF}NotificationConsumerBinding", "NotificationConsumer"),
        "Subscribe": (f"{ONVIF}NotificationProducerBinding", "NotificationProducer"),
        "GetCurrentMessage": (f"{ONVIF}NotificationProducerBinding", "NotificationProducer"),
        "Renew": (f"{ONVIF}PausableSubscriptionManagerBinding", "SubscriptionManager"),
        "Unsubscribe": (f"{ONVIF}PausableSubscriptionManagerBinding", "SubscriptionManager"),
        "PauseSubscription": (
            f"{ONVIF}PausableSubscriptionManagerBinding",
            "PausableSubscriptionManager",
        ),
        "ResumeSubscription": (
            f"{ONVIF}PausableSubscriptionManagerBinding",
            "PausableSubscriptionManager",
        ),
        "CreatePullPoint": (f"{ONVIF}CreatePullPointBinding", "CreatePullPoint"),
        "GetMessages": (f"{ONVIF}PullPointBinding", "PullPoint"),
        "DestroyPullPoint": (f"{ONVIF}PullPointBinding", "PullPoint"),
    },
}
WSN_OPERATIONS = tuple(BINDINGS["1.1"])
ENVELOPE_NS = {"1.1": ns.SOAP11, "1.2": ns.SOAP12}
CONTENT_TYPE = {"1.1": "text/xml", "1.2": "application/soap+xml"}
TOPIC_NS = "http://example.org/hpwsn/topics"


@dataclass
class Reply(SoapResult):
    content_type: str = ""

    @property
    def envelope_ns(self) -> str | None:
        return None if self.root is None else etree.QName(self.root).namespace

    @property
    def body_element(self) -> etree._Element | None:
        if self.root is None:
            return None
        body = self.root.find(f"{{{self.envelope_ns}}}Body")
        return None if body is None else next(iter(body), None)

    @property
    def fault_code(self) -> str | None:
        """Client/Server (SOAP 1.1) or Sender/Receiver/MustUnderstand (SOAP 1.2), no prefix."""
        if self.root is None:
            return None
        code = self.root.findtext(".//faultcode")
        if code is None:
            code = self.root.findtext(".//s12:Fault/s12:Code/s12:Value", namespaces=NSMAP)
        return None if code is None else code.strip().rsplit(":", 1)[-1]

    def is_soap(self, version: str) -> bool:
        return self.envelope_ns == ENVELOPE_NS[version] and self.content_type.startswith(
            CONTENT_TYPE[version]
        )


@dataclass
class Envelope:
    """One request as zeep rendered it, plus the WS-Addressing headers a client adds."""

    version: str
    operation: str
    address: str
    message_id: str
    tree: etree._Element
    http_headers: dict[str, str] = field(default_factory=dict)

    @property
    def env_ns(self) -> str:
        return ENVELOPE_NS[self.version]

    @property
    def header(self) -> etree._Element:
        return get_or_create_header(self.tree)

    @property
    def body(self) -> etree._Element:
        return self.tree.find(f"{{{self.env_ns}}}Body")[0]

    def declare(self, local_name: str, prefixes: dict[str, str]) -> Envelope:
        """Declare namespace prefixes on every wsnt:`local_name` (zeep cannot)."""
        for el in list(self.tree.iter(f"{{{ns.WSNT}}}{local_name}")):
            copy = etree.Element(el.tag, attrib=dict(el.attrib), nsmap={**el.nsmap, **prefixes})
            copy.text, copy.tail = el.text, el.tail
            copy.extend(list(el))
            el.getparent().replace(el, copy)
        return self

    def set_wsa(self, local_name: str, value: str | None) -> Envelope:
        """Replace (or, with None, remove) one WS-Addressing header."""
        for el in self.header.findall(f"{{{ns.WSA}}}{local_name}"):
            self.header.remove(el)
        if value is not None:
            self.header.append(getattr(WSA, local_name)(value))
        return self

    def add_username_token(self, user: str, password: str) -> Envelope:
        """A wsse:Security header as zeep's UsernameToken makes it, marked mustUnderstand."""
        self.tree, self.http_headers = UsernameToken(user, password).apply(
            self.tree, self.http_headers
        )
        security = self.header.find(f"{{{ns.WSSE}}}Security")
        security.set(f"{{{self.env_ns}}}mustUnderstand", "1")
        return self

    def add_header(self, xml: str) -> Envelope:
        self.header.append(etree.fromstring(xml))
        return self

    def to_bytes(self) -> bytes:
        return etree.tostring(self.tree, xml_declaration=True, encoding="utf-8")

    def post(self, url: str | None = None, *, headers: dict[str, str] | None = None) -> Reply:
        resp = httpx.post(
            url or self.address,
            content=self.to_bytes(),
            headers=self.http_headers if headers is None else headers,
            timeout=30,
        )
        return reply_of(resp)


def reply_of(resp: httpx.Response) -> Reply:
    content = resp.content
    try:
        root = etree.fromstring(content) if content.strip().startswith(b"<") else None
    except etree.XMLSyntaxError:  # e.g. an HTML error page
        root = None
    return Reply(
        resp.status_code, content, root, dict(resp.headers), resp.headers.get("content-type", "")
    )


class WsnClient:
    """Builds and sends WSN requests for one SOAP version from a WSDL, as zeep would."""

    def __init__(self, version: str, client: zeep.Client, endpoint: str) -> None:
        self.version = version
        self.client = client
        self.endpoint = endpoint

    # ------------------------------------------------------------- zeep values for xsd:any slots

    def topic(self, text: str, dialect: str = ns.DIALECT_SIMPLE) -> dict[str, Any]:
        """A wsnt:Topic / GetCurrentMessage Topic value (TopicExpressionType)."""
        return {"_value_1": text, "Dialect": dialect}

    def topic_filter(self, text: str, dialect: str = ns.DIALECT_SIMPLE) -> dict[str, Any]:
        element = self.client.get_element(f"{{{ns.WSNT}}}TopicExpression")
        return {"_value_1": [xsd.AnyObject(element, element(text, Dialect=dialect))]}

    def message(self, payload: str) -> dict[str, Any]:
        return {"_value_1": etree.fromstring(payload)}

    def notification(self, topic: str, payload: str, dialect: str = ns.DIALECT_SIMPLE) -> dict:
        return {"Topic": self.topic(topic, dialect), "Message": self.message(payload)}

    # ------------------------------------------------------------- envelopes

    def envelope(
        self,
        operation: str,
        address: str | None = None,
        *,
        message_id: str | None = None,
        **params: Any,
    ) -> Envelope:
        binding_name, port_type = BINDINGS[self.version][operation]
        address = address or self.endpoint
        service = self.client.create_service(binding_name, address)
        # What service.<operation>(...) would send, without sending it.
        tree, http_headers = service._binding._create(
            operation, (), params, client=self.client, options=service._binding_options
        )
        op = service._binding.get(operation)
        action = (
            op.abstract.wsa_action or op.soapaction or ns.action(port_type, operation, base=ns.BW)
        )
        if operation == "Notify":
            action = ns.ACTION_NOTIFY  # Notify's input is named Notify, not NotifyRequest
        message_id = message_id or f"urn:uuid:{uuid.uuid4()}"
        get_or_create_header(tree).extend(
            [WSA.Action(action), WSA.MessageID(message_id), WSA.To(address)]
        )
        return Envelope(self.version, operation, address, message_id, tree, dict(http_headers))

    def call(self, operation: str, address: str | None = None, **params: Any) -> Reply:
        return self.envelope(operation, address, **params).post()

    # ------------------------------------------------------------- common requests

    def subscribe(
        self,
        consumer: str,
        topic: str | None,
        *,
        dialect: str = ns.DIALECT_SIMPLE,
        prefixes: dict[str, str] | None = None,
        termination: Any = None,
        **params: Any,
    ) -> Envelope:
        if topic is not None:
            params["Filter"] = self.topic_filter(topic, dialect)
        if termination is not None:
            params["InitialTerminationTime"] = termination
        env = self.envelope("Subscribe", ConsumerReference={"Address": consumer}, **params)
        if prefixes:
            env.declare("TopicExpression", prefixes)
        return env

    def notify(
        self,
        *messages: tuple[str, str],
        dialect: str = ns.DIALECT_SIMPLE,
        prefixes: dict[str, str] | None = None,
    ) -> Envelope:
        env = self.envelope(
            "Notify",
            NotificationMessage=[self.notification(t, p, dialect) for t, p in messages],
        )
        if prefixes:
            env.declare("Topic", prefixes)
        return env


@cache
def _client(wsdl: str) -> zeep.Client:
    return zeep.Client(wsdl)


def wsn_client(endpoint: str, version: str) -> WsnClient:
    """SOAP 1.1 from the broker's own ?wsdl, SOAP 1.2 from ONVIF's events.wsdl."""
    wsdl = endpoint + "?wsdl" if version == "1.1" else str(ONVIF_EVENTS_WSDL)
    return WsnClient(version, _client(wsdl), endpoint)


@cache
def wsn_schema() -> etree.XMLSchema:
    """WS-BaseNotification and WS-Resource as OASIS published them (CXF's copies, imports
    resolved from their folder): every body and fault element the broker sends."""
    locations = {ns.WSNT: SCHEMAS / "cxf" / "b-2.xsd", ns.WSRF_R: SCHEMAS / "cxf" / "r-2.xsd"}
    imports = "".join(
        f'<xsd:import namespace="{namespace}" schemaLocation="{path.as_uri()}"/>'
        for namespace, path in locations.items()
    )
    return etree.XMLSchema(
        etree.XML(
            f'<xsd:schema xmlns:xsd="http://www.w3.org/2001/XMLSchema">{imports}</xsd:schema>'
        )
    )


def schema_errors(element: etree._Element | None) -> list[str]:
    """Validation errors of one element against b-2.xsd / r-2.xsd (an empty list: it is valid)."""
    if element is None:
        return ["no element"]
    schema = wsn_schema()
    # Validate a copy as its own document (lxml keeps the namespace declarations in scope).
    doc = etree.fromstring(etree.tostring(element))
    if schema.validate(doc):
        return []
    return [f"{e.line}: {e.message}" for e in schema.error_log]
