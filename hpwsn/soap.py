"""SOAP 1.1/1.2 envelopes with WS-Addressing: parse requests, build responses and faults."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from xml.sax.saxutils import escape

from lxml import etree

from hpwsn import errors, ns
from hpwsn.xmlsafe import MAX_ATTRIBUTES, MAX_NAMESPACES, XMLRejected, charset_of, parse
from hpwsn.xsdtime import format_datetime

SOAP11_CT = "text/xml; charset=utf-8"
SOAP12_CT = "application/soap+xml; charset=utf-8"

# Headers we understand; mustUnderstand="1" on any other header is a MustUnderstand fault.
_UNDERSTOOD_NS = {ns.WSA, ns.WSSE, ns.WSU, ns.HPWSN}


class SoapFault(Exception):
    """A fault to answer with. `wsn_name` set means a WSN/WSRF fault element in the detail."""

    def __init__(
        self,
        message: str,
        *,
        code: str = "Sender",
        wsn_name: str | None = None,
        wsn_ns: str = ns.WSNT,
        subcode: str | None = None,
        http_status: int | None = None,
        detail_xml: str = "",
        qname: tuple[str, str] | None = None,
        http_headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code  # "Sender" or "Receiver" (SOAP 1.1: Client / Server)
        self.wsn_name = wsn_name
        self.wsn_ns = wsn_ns
        self.subcode = subcode
        self.http_status = http_status
        self.detail_xml = detail_xml
        # A fault code of another specification, (namespace, local name): WS-Security's
        # wsse:FailedAuthentication is the faultcode in SOAP 1.1 and a Subcode in SOAP 1.2.
        self.qname = qname
        self.http_headers = http_headers  # e.g. WWW-Authenticate with a 401
        # The SOAP version to answer in when the request's envelope has said it (set by
        # parse_request); None: the version of the request's media type.
        self.version: str | None = None


def to_fault(exc: errors.WsnError) -> SoapFault:
    """The fault that answers a WS-Notification error raised by a service."""
    if not exc.fault:
        return SoapFault(exc.message)
    return SoapFault(
        exc.message, wsn_name=exc.fault, wsn_ns=exc.namespace, detail_xml=exc.detail_xml
    )


def wsn_fault(
    name: str, message: str, *, wsn_ns: str = ns.WSNT, code: str = "Sender", detail_xml: str = ""
) -> SoapFault:
    return SoapFault(message, code=code, wsn_name=name, wsn_ns=wsn_ns, detail_xml=detail_xml)


def security_fault(code: str, message: str, *, http_status: int | None = None) -> SoapFault:
    """A WS-Security fault (wsse:FailedAuthentication, wsse:InvalidSecurityToken, ...)."""
    headers: tuple[tuple[str, str], ...] = ()
    if http_status == 401:
        headers = (("WWW-Authenticate", 'Basic realm="HPwsn", charset="UTF-8"'),)
    return SoapFault(message, qname=(ns.WSSE, code), http_status=http_status, http_headers=headers)


def resource_unknown(message: str) -> SoapFault:
    return wsn_fault("ResourceUnknownFault", message, wsn_ns=ns.WSRF_R)


@dataclass(slots=True)
class Request:
    version: str  # "1.1" or "1.2"
    body: etree._Element  # the first element inside soap:Body
    header: etree._Element | None
    message_id: str | None = None
    to: str | None = None
    action: str | None = None
    reply_to: str | None = None
    reference_params: dict[str, str] = field(default_factory=dict)
    security: etree._Element | None = None

    @property
    def env_ns(self) -> str:
        return ns.SOAP11 if self.version == "1.1" else ns.SOAP12


_MEDIA_OF = {"1.1": "text/xml", "1.2": "application/soap+xml"}
_SOAP_MEDIA = frozenset(_MEDIA_OF.values())


def soap_version_of(content_type: str | None) -> str:
    """The SOAP version a Content-Type names, by its media type alone: media types are
    case-insensitive (RFC 9110, 8.3.1), and a parameter (an `action` URI) may mention the other."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return "1.2" if media == "application/soap+xml" else "1.1"


def parse_request(
    data: bytes,
    *,
    max_bytes: int,
    max_depth: int,
    content_type: str | None,
    max_namespaces: int = MAX_NAMESPACES,
    max_attributes: int = MAX_ATTRIBUTES,
) -> Request:
    """Parse a SOAP request; every refusal is a SoapFault in the version the client spoke."""
    version = soap_version_of(content_type)
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media and media not in _SOAP_MEDIA:
        raise SoapFault(
            f"Content-Type '{media}' is not a SOAP media type: send SOAP 1.1 as text/xml or "
            "SOAP 1.2 as application/soap+xml",
            http_status=415,
        )
    try:
        root = parse(
            data,
            max_bytes=max_bytes,
            max_depth=max_depth,
            charset=charset_of(content_type),
            max_namespaces=max_namespaces,
            max_attributes=max_attributes,
        )
    except XMLRejected as exc:
        raise SoapFault(str(exc), subcode="MalformedRequest") from None
    if root.tag == f"{{{ns.SOAP11}}}Envelope":
        found = "1.1"
    elif root.tag == f"{{{ns.SOAP12}}}Envelope":
        found = "1.2"
    elif etree.QName(root).localname == "Envelope":
        raise SoapFault(
            f"the Envelope's namespace '{etree.QName(root).namespace}' is neither SOAP 1.1 "
            f"({ns.SOAP11}) nor SOAP 1.2 ({ns.SOAP12})",
            code="VersionMismatch",
        )
    else:
        raise SoapFault(f"the document element {root.tag} is not a SOAP 1.1 or 1.2 Envelope")
    if media == "text/xml" and found == "1.2":
        # ZoneMinder (and others) send SOAP 1.2 envelopes as text/xml. The envelope's namespace
        # says which SOAP this is without doubt: answer in SOAP 1.2 rather than refuse.
        pass
    elif media and found != version:
        # The media type names the binding (text/xml: SOAP 1.1, application/soap+xml: SOAP 1.2);
        # a SOAP 1.1 envelope sent as SOAP 1.2 is a VersionMismatch, answered in SOAP 1.2 with
        # the envelopes this node supports (part 1, 5.4.7).
        raise SoapFault(
            f"a SOAP {found} envelope was sent as '{media}', the SOAP {version} media type; "
            f"SOAP {found} is sent as {_MEDIA_OF[found]}",
            code="VersionMismatch",
        )
    try:
        return _read_envelope(root, found)
    except SoapFault as fault:
        # From here the envelope says which SOAP this is (a SOAP 1.2 one sent as text/xml, or
        # with no Content-Type): its faults are answered in that version, not the media type's.
        fault.version = found
        raise


def _read_envelope(root: etree._Element, version: str) -> Request:
    env_ns = ns.SOAP11 if version == "1.1" else ns.SOAP12
    header_tag, body_tag = f"{{{env_ns}}}Header", f"{{{env_ns}}}Body"
    header = body = None
    for child in root:  # one pass rather than a find (an ElementPath walk) for each
        if child.tag == header_tag and header is None:
            header = child
        elif child.tag == body_tag and body is None:
            body = child
    if body is None:
        raise SoapFault("the SOAP envelope has no Body")
    children = [c for c in body if isinstance(c.tag, str)]
    if not children:
        raise SoapFault("the SOAP Body is empty")
    req = Request(version=version, body=children[0], header=header)
    if header is not None:
        _read_headers(req, header, env_ns)
    return req


def _split_tag(tag: str) -> tuple[str | None, str]:
    """An element's namespace and local name, as etree.QName gives them, without building one."""
    if tag[:1] == "{":
        namespace, _, localname = tag[1:].partition("}")
        return namespace, localname
    return None, tag


def _read_headers(req: Request, header: etree._Element, env_ns: str) -> None:
    mu_attr = f"{{{env_ns}}}mustUnderstand"
    for h in header:
        if not isinstance(h.tag, str):
            continue
        namespace, localname = _split_tag(h.tag)
        if h.get(mu_attr) in ("1", "true") and namespace not in _UNDERSTOOD_NS:
            raise SoapFault(
                f"header {h.tag} is marked mustUnderstand but is not understood",
                code="MustUnderstand",
            )
        if namespace == ns.WSA:
            text = (h.text or "").strip()
            if localname == "MessageID":
                req.message_id = text
            elif localname == "To":
                req.to = text
            elif localname == "Action":
                req.action = text
            elif localname == "ReplyTo":
                addr = h.find(f"{{{ns.WSA}}}Address")
                req.reply_to = (addr.text or "").strip() if addr is not None else None
        elif namespace == ns.WSSE and localname == "Security":
            req.security = h
        elif h.get(f"{{{ns.WSA}}}IsReferenceParameter") in ("1", "true") or namespace == ns.HPWSN:
            req.reference_params[localname] = (h.text or "").strip()


def _envelope(version: str, header_xml: str, body_xml: str) -> bytes:
    env_ns = ns.SOAP11 if version == "1.1" else ns.SOAP12
    return (
        f'<?xml version="1.0" encoding="utf-8"?><soap:Envelope xmlns:soap="{env_ns}" '
        f'xmlns:wsa="{ns.WSA}" xmlns:wsnt="{ns.WSNT}"><soap:Header>{header_xml}</soap:Header>'
        f"<soap:Body>{body_xml}</soap:Body></soap:Envelope>"
    ).encode()


def new_message_id() -> str:
    return f"urn:uuid:{uuid.uuid4()}"


def response(req: Request, *, action: str, body_xml: str) -> bytes:
    """A reply envelope with WS-Addressing Action, MessageID and RelatesTo."""
    header = (
        f"<wsa:Action>{escape(action)}</wsa:Action>"
        f"<wsa:MessageID>{new_message_id()}</wsa:MessageID>"
    )
    if req.message_id:
        header += f"<wsa:RelatesTo>{escape(req.message_id)}</wsa:RelatesTo>"
    header += f"<wsa:To>{ns.WSA_ANONYMOUS}</wsa:To>"
    return _envelope(req.version, header, body_xml)


def _qname_prefix(namespace: str) -> str:
    return "wsse" if namespace == ns.WSSE else "q"


# Characters XML 1.0 cannot carry at all, even escaped (a NUL from a URL path, a lone surrogate).
_NOT_XML = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(text: str) -> str:
    """`text` escaped for XML content, characters XML cannot carry written as \\xNN / \\uNNNN."""
    return escape(_NOT_XML.sub(lambda m: m.group().encode("unicode_escape").decode(), text))


def fault_envelope(fault: SoapFault, *, version: str, relates_to: str | None = None) -> bytes:
    now = format_datetime(datetime.now(UTC))
    detail = ""
    if fault.wsn_name:
        detail = (
            f'<wsnf:{fault.wsn_name} xmlns:wsnf="{fault.wsn_ns}" xmlns:wsrf-bf="{ns.WSRF_BF}">'
            f"<wsrf-bf:Timestamp>{now}</wsrf-bf:Timestamp>"
            f'<wsrf-bf:Description xml:lang="en">{xml_text(fault.message)}</wsrf-bf:Description>'
            f"{fault.detail_xml}"
            f"</wsnf:{fault.wsn_name}>"
        )
    text = xml_text(fault.message)
    header = (
        f"<wsa:Action>{ns.WSA}/fault</wsa:Action><wsa:MessageID>{new_message_id()}</wsa:MessageID>"
    )
    if relates_to:
        header += f"<wsa:RelatesTo>{xml_text(relates_to)}</wsa:RelatesTo>"
    if fault.code == "VersionMismatch" and version == "1.2":
        # SOAP 1.2 part 1 section 5.4.7: name the envelopes this node understands.
        header += (
            f'<soap:Upgrade><soap:SupportedEnvelope qname="e12:Envelope" xmlns:e12="{ns.SOAP12}"/>'
            f'<soap:SupportedEnvelope qname="e11:Envelope" xmlns:e11="{ns.SOAP11}"/></soap:Upgrade>'
        )
    if version == "1.1":
        code = {"Sender": "Client", "Receiver": "Server"}.get(fault.code, fault.code)
        faultcode = f"<faultcode>soap:{code}</faultcode>"
        if fault.qname:
            q = _qname_prefix(fault.qname[0])
            faultcode = f'<faultcode xmlns:{q}="{fault.qname[0]}">{q}:{fault.qname[1]}</faultcode>'
        body = (
            f"<soap:Fault>{faultcode}<faultstring>{text}</faultstring>"
            + (f"<detail>{detail}</detail>" if detail else "")
            + "</soap:Fault>"
        )
    else:
        sub = ""
        if fault.wsn_name:
            sub = (
                f'<soap:Subcode><soap:Value xmlns:wsnf="{fault.wsn_ns}">wsnf:{fault.wsn_name}'
                "</soap:Value></soap:Subcode>"
            )
        elif fault.qname:
            q = _qname_prefix(fault.qname[0])
            sub = (
                f'<soap:Subcode><soap:Value xmlns:{q}="{fault.qname[0]}">{q}:{fault.qname[1]}'
                "</soap:Value></soap:Subcode>"
            )
        body = (
            f"<soap:Fault><soap:Code><soap:Value>soap:{fault.code}</soap:Value>{sub}</soap:Code>"
            f'<soap:Reason><soap:Text xml:lang="en">{text}</soap:Text></soap:Reason>'
            + (f"<soap:Detail>{detail}</soap:Detail>" if detail else "")
            + "</soap:Fault>"
        )
    return _envelope(version, header, body)


def fault_http_status(fault: SoapFault, version: str) -> int:
    if fault.http_status:
        return fault.http_status
    if version == "1.2" and fault.code == "Sender":
        return 400  # SOAP 1.2 HTTP binding: Sender faults are 400
    return 500  # SOAP 1.1 answers every fault with 500


def content_type(version: str) -> str:
    return SOAP11_CT if version == "1.1" else SOAP12_CT
