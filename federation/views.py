"""The inbound edge of the federation: a peer pushes here what this site's subscribers want."""

from __future__ import annotations

import hmac
import time
from collections.abc import Mapping

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from dispatch.push import signature, signing_key
from federation.peers import SIGNATURE_TOLERANCE_S, inbound_token, link_signing_secret
from federation.services import InboundBusy, InboundLimited, federation_accept
from hpwsn import errors, ns, wsn
from hpwsn.soap import (
    SoapFault,
    content_type,
    fault_envelope,
    fault_http_status,
    parse_request,
    to_fault,
)


def push_signed(
    secret: str, peer: str, headers: Mapping[str, str], body: bytes, *, now: float
) -> bool:
    """Whether a push came signed by `peer` with this site's links' SigningSecret there, at most
    SIGNATURE_TOLERANCE_S away from `now` (a recorded push replayed later is refused)."""
    message_id = headers.get("webhook-id", "")
    timestamp = headers.get("webhook-timestamp", "")
    if not message_id or not (timestamp.isascii() and timestamp.isdigit()):
        return False
    if abs(now - int(timestamp)) > SIGNATURE_TOLERANCE_S:
        return False
    key = signing_key(link_signing_secret(secret, peer))
    expected = signature(key, message_id, timestamp, body).encode()
    return any(
        hmac.compare_digest(given[3:].encode(errors="replace"), expected)
        for given in headers.get("webhook-signature", "").split()
        if given.startswith("v1,")
    )


@csrf_exempt
async def inbound(request: HttpRequest, peer: str, token: str) -> HttpResponse:
    """A wsnt:Notify pushed by a peer's pump (a link of ours): stored, then 202."""
    if request.method != "POST":
        return HttpResponse(status=405, headers={"Allow": "POST"})
    known = {p.name for p in settings.HPWSN_FEDERATION_PEERS}
    expected = inbound_token(settings.SECRET_KEY, peer)
    if peer not in known or not hmac.compare_digest(token, expected):
        return HttpResponse(status=404)
    if not settings.HPWSN_FEDERATION_ACCEPT_UNSIGNED and not push_signed(
        settings.SECRET_KEY, peer, request.headers, request.body, now=time.time()
    ):
        # A 4xx the peer's pump does not retry: what it holds is dead-lettered there, visible.
        return HttpResponse(
            f"the push is not signed with the SigningSecret of {settings.HPWSN_SITE_NAME}'s "
            f"links at {peer}, or its webhook-timestamp is more than "
            f"{SIGNATURE_TOLERANCE_S} s away",
            status=401,
            content_type="text/plain; charset=utf-8",
        )
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
        # The Notify's own list (hpwsn:MessageIds, after its messages), not an Id anywhere in
        # it: a publisher's payload may hold hpwsn:Id elements too.
        ids = [
            (el.text or "").strip()
            for listed in req.body.iterchildren(f"{{{ns.HPWSN}}}MessageIds")
            for el in listed.iterchildren(f"{{{ns.HPWSN}}}Id")
        ]
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
    except InboundLimited as exc:
        # 503, not 429: the peer's pump waits a 429 out for HPWSN_RETRY_THROTTLED_MIN_S at least,
        # a 503 for its Retry-After, the time the peer's allowance here takes to hold the push.
        return HttpResponse(
            str(exc),
            status=503,
            headers={"Retry-After": str(exc.retry_after)},
            content_type="text/plain; charset=utf-8",
        )
    return HttpResponse(status=202)
