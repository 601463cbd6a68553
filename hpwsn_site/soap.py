"""The /wsn/ endpoint: one hardened parse, dispatch on the body element, WSN faults."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from xml.sax.saxutils import escape

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from lxml import etree

from dispatch import soap as dispatch_soap
from hpwsn import errors, ns
from hpwsn.soap import (
    SoapFault,
    content_type,
    fault_envelope,
    fault_http_status,
    parse_request,
    resource_unknown,
    response,
    soap_version_of,
    to_fault,
)
from hpwsn.xmlsafe import XMLRejected
from hpwsn.xmlsafe import parse as parse_xml
from hpwsn_site import wsdl
from hpwsn_site.auth import authenticate
from hpwsn_site.clients import request_client
from hpwsn_site.soapcall import Call, Handler, Reply, ResourceBusy, db
from monitoring import events
from subscriptions import soap as subscriptions_soap
from subscriptions.selectors import resource_exists

log = logging.getLogger(__name__)

T = f"{{{ns.WSNT}}}"
HANDLERS: dict[str, Handler] = {
    f"{T}Notify": dispatch_soap.notify,
    f"{T}GetCurrentMessage": dispatch_soap.get_current_message,
    f"{T}Subscribe": subscriptions_soap.subscribe,
    f"{T}Renew": subscriptions_soap.renew,
    f"{T}Unsubscribe": subscriptions_soap.unsubscribe,
    f"{T}PauseSubscription": subscriptions_soap.pause,
    f"{T}ResumeSubscription": subscriptions_soap.resume,
    f"{T}CreatePullPoint": subscriptions_soap.create_pull_point,
    f"{T}GetMessages": subscriptions_soap.get_messages,
    f"{T}DestroyPullPoint": subscriptions_soap.destroy_pull_point,
    f"{{{ns.WSNBR}}}RegisterPublisher": subscriptions_soap.register_publisher,
    f"{{{ns.WSNBR}}}DestroyRegistration": subscriptions_soap.destroy_registration,
}
# Inside the legacy WsnProcess envelope a bare NotificationMessage is a publication (figure 5-4).
LEGACY_HANDLERS: dict[str, Handler] = {
    **HANDLERS,
    f"{T}NotificationMessage": dispatch_soap.notification_message,
}
LEGACY_PROCESS = f"{{{ns.LEGACY}}}WsnProcess"
# What a resource's own address serves; anything else sent there is refused, never run as if
# it had been sent to /wsn/ (a Notify to a pull point's address was published again).
RESOURCE_OPERATIONS = {
    "subscriptions": frozenset(
        f"{T}{op}" for op in ("Renew", "Unsubscribe", "PauseSubscription", "ResumeSubscription")
    ),
    "pullpoints": frozenset(f"{T}{op}" for op in ("GetMessages", "DestroyPullPoint")),
    "registrations": frozenset((f"{T}Renew", f"{{{ns.WSNBR}}}DestroyRegistration")),
}
_RESOURCE_ID = re.compile(r"[A-Za-z0-9._~-]{1,128}")


def base_url(request: HttpRequest) -> str:
    return settings.HPWSN_PUBLIC_URL.rstrip("/") or f"{request.scheme}://{request.get_host()}"


def _legacy_inner(process: etree._Element) -> etree._Element:
    """The WSN element a WsnProcess carries: as child elements, or as an XML string parameter."""
    for child in process:
        if not isinstance(child.tag, str):
            continue
        if etree.QName(child).namespace == ns.WSNT:
            return child
        text = (child.text or "").strip()
        if text.startswith("<"):
            try:
                return parse_xml(
                    text.encode(),
                    max_bytes=settings.HPWSN_MAX_REQUEST_BYTES,
                    max_depth=settings.HPWSN_MAX_XML_DEPTH,
                )
            except XMLRejected as exc:
                raise SoapFault(f"WsnProcess message: {exc}") from None
    raise SoapFault("WsnProcess carries no WS-Notification message")


async def _check_resource(call: Call) -> None:
    """A request to a resource's address: the resource must exist and serve the operation."""
    kind, rid = call.resource_kind, call.resource_id or ""
    if kind is None:
        return
    what = {"subscriptions": "subscription", "pullpoints": "pull point"}.get(
        kind, "publisher registration"
    )
    if not _RESOURCE_ID.fullmatch(rid):
        raise resource_unknown(f"no {what} has the id {rid[:128]!r}")
    if call.body.tag in RESOURCE_OPERATIONS[kind]:
        return  # the operation's service answers ResourceUnknownFault itself
    if not await db(resource_exists, kind=kind, resource_id=rid):
        raise resource_unknown(f"{what} {rid} does not exist")
    raise SoapFault(
        f"{etree.QName(call.body).localname} is not an operation of a {what}; "
        f"send it to {call.base_url}/wsn/"
    )


async def run_call(call: Call, handlers: dict[str, Handler]) -> Reply | None:
    handler = handlers.get(call.body.tag)
    if handler is None:
        raise SoapFault(f"{call.body.tag} is not a WS-Notification operation this endpoint serves")
    await _check_resource(call)
    try:
        return await handler(call)
    except errors.WsnError as exc:
        events.refused(operation=call.body.tag, principal=call.principal, exc=exc)
        raise to_fault(exc) from None


def legacy_reply(reply: Reply | None) -> str:
    """WsnProcessResponse whose `return` string is the reply as a standalone XML document."""
    text = "accepted"
    if reply is not None:
        inner = reply.body.decode() if isinstance(reply.body, bytes) else reply.body
        # The reply uses prefixes declared on our envelope; re-serialising it inside a wrapper
        # that declares them makes lxml put the declarations on the element itself.
        wrapper = etree.fromstring(
            f'<w xmlns:wsnt="{ns.WSNT}" xmlns:wsa="{ns.WSA}" xmlns:xsi="{ns.XSI}">{inner}</w>'
        )
        text = etree.tostring(wrapper[0], encoding="unicode")
    return (
        f'<org:WsnProcessResponse xmlns:org="{ns.LEGACY}"><return>{escape(text)}</return>'
        "</org:WsnProcessResponse>"
    )


def _get(request: HttpRequest) -> HttpResponse:
    endpoint = base_url(request) + "/wsn/"
    name = request.GET.get("wsdl") or request.GET.get("xsd")
    if "wsdl" in request.GET or "xsd" in request.GET:
        doc = wsdl.document(name or "wsn.wsdl", endpoint)
        if doc is None:
            return HttpResponse(
                f"no document named {name}\n", status=404, content_type="text/plain"
            )
        return HttpResponse(doc, content_type="text/xml; charset=utf-8")
    return HttpResponse(
        "HPwsn WS-Notification endpoint: POST SOAP 1.1/1.2 here; the WSDL is at ?wsdl\n",
        content_type="text/plain",
    )


@dataclass(frozen=True, slots=True)
class Exchange:
    """A SOAP answer independent of the HTTP server that carries it."""

    status: int
    content_type: str | None
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


def fault_exchange(fault: SoapFault, version: str, relates_to: str | None = None) -> Exchange:
    return Exchange(
        fault_http_status(fault, version),
        content_type(version),
        fault_envelope(fault, version=version, relates_to=relates_to),
        fault.http_headers,
    )


def too_large(version: str) -> Exchange:
    limit = settings.HPWSN_MAX_REQUEST_BYTES
    return fault_exchange(
        SoapFault(f"request exceeds the limit of {limit} bytes", http_status=413), version
    )


async def soap_exchange(
    *,
    data: bytes,
    ctype: str | None,
    base: str,
    resource_id: str | None,
    authorization: str | None = None,
    idempotency_key: str | None = None,
    resource_kind: str | None = None,
    client: str = "",
) -> Exchange:
    """Parse one SOAP request, run its operation, and shape the reply or the fault. `client`:
    the caller's address (its failed credentials, and an anonymous caller's allowance of
    subscriptions, pull points and registrations, are counted by it)."""
    version = soap_version_of(ctype)
    req = None
    try:
        req = parse_request(
            data,
            max_bytes=settings.HPWSN_MAX_REQUEST_BYTES,
            max_depth=settings.HPWSN_MAX_XML_DEPTH,
            content_type=ctype,
            max_namespaces=settings.HPWSN_MAX_XML_NAMESPACES,
            max_attributes=settings.HPWSN_MAX_XML_ATTRIBUTES,
        )
        version = req.version
        principal = await authenticate(
            security=req.security, authorization=authorization, client=client
        )
        call = Call(
            req=req,
            body=req.body,
            base_url=base,
            resource_id=resource_id,
            principal=principal,
            idempotency_key=idempotency_key,
            resource_kind=resource_kind if resource_id else None,
            client=client,
        )
        if req.body.tag == LEGACY_PROCESS:
            call.body = _legacy_inner(req.body)
            reply = await run_call(call, LEGACY_HANDLERS)
            body = response(
                req, action=f"{ns.LEGACY}/WsnProcessResponse", body_xml=legacy_reply(reply)
            )
            return Exchange(200, content_type(version), body)
        reply = await run_call(call, HANDLERS)
    except SoapFault as fault:
        return fault_exchange(fault, fault.version or version, req.message_id if req else None)
    except ResourceBusy as exc:
        fault = SoapFault(
            str(exc),
            code="Receiver",
            wsn_name="ResourceUnavailableFault",
            wsn_ns=ns.WSRF_R,
            http_status=503,
            http_headers=(("Retry-After", "1"),),
        )
        return fault_exchange(fault, version, req.message_id if req else None)
    except Exception:
        log.exception("unexpected error while serving a SOAP request")
        fault = SoapFault("internal error; the request was not processed", code="Receiver")
        return fault_exchange(fault, version, req.message_id if req else None)
    if reply is None:
        return Exchange(202, None, b"")
    body_xml = reply.body.decode() if isinstance(reply.body, bytes) else reply.body
    return Exchange(
        200, content_type(version), response(req, action=reply.action, body_xml=body_xml)
    )


@csrf_exempt
async def wsn_endpoint(
    request: HttpRequest, kind: str | None = None, resource_id: str | None = None
) -> HttpResponse:
    """/wsn/ through Django: the WSDL on GET; SOAP POSTs normally arrive by hpwsn_site.fastpath."""
    if request.method == "GET":
        return _get(request)
    ctype = request.META.get("CONTENT_TYPE")
    if request.method != "POST":
        return HttpResponse(status=405, headers={"Allow": "GET, POST"})
    length = int(request.META.get("CONTENT_LENGTH") or 0)
    try:
        if length > settings.HPWSN_MAX_REQUEST_BYTES:
            raise RequestDataTooBig
        data = request.body
    except RequestDataTooBig:
        ex = too_large(soap_version_of(ctype))
    else:
        ex = await soap_exchange(
            data=data,
            ctype=ctype,
            base=base_url(request),
            resource_id=resource_id,
            resource_kind=kind,
            authorization=request.META.get("HTTP_AUTHORIZATION"),
            idempotency_key=request.META.get("HTTP_IDEMPOTENCY_KEY"),
            client=request_client(request.META),
        )
    resp = HttpResponse(ex.body, status=ex.status)
    if ex.content_type:
        resp["Content-Type"] = ex.content_type
    for name, value in ex.headers:
        resp[name] = value
    return resp
