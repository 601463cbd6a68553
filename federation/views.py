"""The inbound edge of the federation: a peer pushes here what this site's subscribers want."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from federation.peers import inbound_token
from federation.services import InboundBusy, federation_accept
from hpwsn import errors, ns, wsn
from hpwsn.soap import SoapFault, content_type, fault_envelope, fault_http_status, parse_request
from hpwsn_site.soap import to_fault


@csrf_exempt
async def inbound(request: HttpRequest, peer: str, token: str) -> HttpResponse:
    """A wsnt:Notify pushed by a peer's pump (a link of ours): stored, then 202."""
    if request.method != "POST":
        return HttpResponse(status=405, headers={"Allow": "POST"})
    known = {p.name for p in settings.HPWSN_FEDERATION_PEERS}
    expected = inbound_token(settings.SECRET_KEY, peer)
    if peer not in known or not hmac.compare_digest(token, expected):
        return HttpResponse(status=404)
    version = "1.1"
    try:
        req = parse_request(
            request.body,
            max_bytes=settings.HPWSN_MAX_REQUEST_BYTES,
            max_depth=settings.HPWSN_MAX_XML_DEPTH,
            content_type=request.META.get("CONTENT_TYPE"),
        )
        version = req.version
        if req.body.tag != f"{{{ns.WSNT}}}Notify":
            raise SoapFault(f"{req.body.tag} is not a wsnt:Notify")
        notifications = wsn.parse_notify(req.body)
        ids = [(el.text or "").strip() for el in req.body.iter(f"{{{ns.HPWSN}}}Id")]
        await federation_accept(
            peer=peer, notifications=notifications, ids=ids, message_id=req.message_id
        )
    except errors.WsnError as exc:
        fault = to_fault(exc)
        return HttpResponse(
            fault_envelope(fault, version=version),
            status=fault_http_status(fault, version),
            content_type=content_type(version),
        )
    except SoapFault as fault:
        return HttpResponse(
            fault_envelope(fault, version=version),
            status=fault_http_status(fault, version),
            content_type=content_type(version),
        )
    except InboundBusy:  # the peer's pump retries it after a while, in order
        return HttpResponse(status=503, headers={"Retry-After": "1"})
    return HttpResponse(status=202)
