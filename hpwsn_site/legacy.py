"""The thesis's ServiceMix-style service, `String WsnProcess(String message)`, served by Spyne.

JAX-WS clients of the original HPwsn send the WSN message as an escaped string parameter; Spyne
describes that RPC interface (its WSDL is at /wsn/legacy/?wsdl) and decodes the call. The message
then goes through the same handlers as /wsn/ (which also accepts WsnProcess bodies directly).
"""

from __future__ import annotations

import logging
import re

from asgiref.sync import async_to_sync
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from spyne import Application, Fault, ServiceBase, Unicode, rpc
from spyne.protocol.soap import Soap11
from spyne.server.django import DjangoView

from hpwsn import ns
from hpwsn.soap import Request, SoapFault, content_type, fault_envelope, fault_http_status
from hpwsn.xmlsafe import XMLRejected
from hpwsn.xmlsafe import parse as parse_xml
from hpwsn_site.auth import authenticate
from hpwsn_site.clients import request_client
from hpwsn_site.soap import LEGACY_HANDLERS, base_url, legacy_reply, run_call
from hpwsn_site.soapcall import Call

log = logging.getLogger(__name__)


class WsnProcessService(ServiceBase):
    @rpc(Unicode(min_occurs=1), _returns=Unicode, _body_style="wrapped")
    def WsnProcess(ctx, message: str) -> str:
        try:
            body = parse_xml(
                (message or "").encode(),
                max_bytes=settings.HPWSN_MAX_REQUEST_BYTES,
                max_depth=settings.HPWSN_MAX_XML_DEPTH,
            )
        except XMLRejected as exc:
            raise Fault("Client", f"WsnProcess message: {exc}") from None

        to = None
        security = None
        header = ctx.in_header_doc
        for h in header or []:
            if getattr(h, "tag", "") == f"{{{ns.WSA}}}To":
                to = (h.text or "").strip()
            elif getattr(h, "tag", "") == f"{{{ns.WSSE}}}Security":
                security = h
        req = Request(version="1.1", body=body, header=None, to=to)
        client = request_client(ctx.transport.req.META)
        try:
            # The same callers and rights as /wsn/: a UsernameToken or HTTP Basic, else anonymous;
            # failed credentials counted by the caller's address, as there.
            principal = async_to_sync(authenticate)(
                security=security,
                authorization=ctx.transport.req.META.get("HTTP_AUTHORIZATION"),
                client=client,
            )
            call = Call(
                req=req,
                body=body,
                base_url=base_url(ctx.transport.req),
                resource_id=None,
                principal=principal,
                client=client,
            )
            reply = async_to_sync(run_call)(call, LEGACY_HANDLERS)
        except SoapFault as fault:
            raise Fault("Client" if fault.code == "Sender" else "Server", fault.message) from None
        from lxml import etree

        inner = etree.fromstring(legacy_reply(reply).encode())
        return inner.findtext("return") or ""


legacy_application = Application(
    [WsnProcessService],
    tns=ns.LEGACY,
    name="WsnProcessService",
    in_protocol=Soap11(validator="lxml"),
    out_protocol=Soap11(),
)
_spyne_view = DjangoView.as_view(application=legacy_application)


@csrf_exempt
def legacy_view(request: HttpRequest) -> HttpResponse:
    """Spyne's view behind the same hardened parse, size limit and SOAP faults as /wsn/."""
    if request.method == "POST":
        limit = settings.HPWSN_MAX_REQUEST_BYTES
        fault = None
        try:
            parse_xml(request.body, max_bytes=limit, max_depth=settings.HPWSN_MAX_XML_DEPTH)
        except RequestDataTooBig:
            fault = SoapFault(f"request exceeds the limit of {limit} bytes", http_status=413)
        except XMLRejected as exc:
            fault = SoapFault(str(exc))
        if fault is not None:
            response = HttpResponse(
                fault_envelope(fault, version="1.1"),
                status=fault_http_status(fault, "1.1"),
                content_type=content_type("1.1"),
            )
            return _logged_as_client_error(request, response, fault.message)
    response = _spyne_view(request)
    if response.status_code == 500 and _CLIENT_FAULT.search(response.content):
        return _logged_as_client_error(request, response, _fault_string(response.content))
    return response


def _logged_as_client_error(request: HttpRequest, response: HttpResponse, why: str) -> HttpResponse:
    """SOAP 1.1 answers every fault with 500, which Django logs as "Internal Server Error" (and
    Spyne with a traceback): the caller's mistake is logged as what it is, in one line."""
    log.info("client fault on %s: %s", request.path, why[:300])
    response._has_been_logged = True  # type: ignore[attr-defined]  # read by Django's log_response
    return response


_CLIENT_FAULT = re.compile(rb"<faultcode>(?:[\w.-]+:)?Client[\w.]*</faultcode>")
_FAULT_STRING = re.compile(rb"<faultstring>(.{0,300})", re.DOTALL)


def _fault_string(content: bytes) -> str:
    m = _FAULT_STRING.search(content)
    return m.group(1).split(b"</faultstring>")[0].decode("utf-8", "replace") if m else ""
