"""REST publish on the ASGI fast path: POST /api/v1/topics/{path}/messages without Django.

Django's request cycle costs about 1.8 ms of CPU per request here (docs/benchmarks.md), DRF's
adds more; a publish needs none of it. Requests with an API token, HTTP Basic or no credentials
are answered here (hpwsn_site/fastpath.py routes them) by the same `publish_accept` the DRF view
calls, with the same authentication, throttle and problem bodies. Requests that carry a session
cookie and no Authorization header go to the DRF view, which checks the session and its CSRF
token; so does anything that is not JSON or XML.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from rest_framework import exceptions

from hpwsn import errors
from hpwsn.soap import SoapFault
from hpwsn_site import auth as soap_auth
from hpwsn_site.api import auth
from hpwsn_site.api.exceptions import RequestTooLarge, ServiceUnavailable
from hpwsn_site.api.problems import CONTENT_TYPE, api_problem, wsn_problem
from hpwsn_site.api.publish import publish_accept
from hpwsn_site.api.selectors import api_token_cached
from hpwsn_site.api.services import TOKEN_PREFIX, token_digest
from hpwsn_site.api.throttling import throttle_hit_async
from hpwsn_site.soap import Exchange
from hpwsn_site.soapcall import ResourceBusy, db
from topics.acl import ANONYMOUS, Principal

log = logging.getLogger(__name__)

PATH = re.compile(r"^/api/v1/topics/([^/]{1,1024})/messages$")
JSON_TYPES = ("application/json",)
XML_TYPES = ("application/xml", "text/xml")


def routed(*, path: str, ctype: str, authorization: str, cookie: str) -> str | None:
    """The topic of a publish this path serves; None sends the request to Django."""
    m = PATH.match(path)
    if m is None or (cookie and not authorization):
        return None
    media = ctype.split(";", 1)[0].strip().lower()
    return m.group(1) if media in JSON_TYPES + XML_TYPES else None


async def _bearer(authorization: str) -> Principal:
    token = authorization.partition(" ")[2].strip()
    if token.startswith(TOKEN_PREFIX):
        found = api_token_cached(digest=token_digest(token))
        if found is not None:
            principal = auth.principal_cached(found[1])
            if principal is not None and not auth.touch_due(found[0]):
                return principal
    # Not known in this process a second ago, or due a check: the full (blocking) way.
    user = await db(auth.bearer_user, authorization=authorization)
    assert user is not None
    return user.principal


async def _principal(authorization: str, client: str) -> Principal:
    scheme = authorization.partition(" ")[0].lower()
    if not authorization:
        return ANONYMOUS
    if scheme == "bearer":
        return await _bearer(authorization)
    if scheme == "basic":
        try:
            principal = await soap_auth.authenticate(
                security=None, authorization=authorization, client=client
            )
        except SoapFault as fault:
            if fault.http_status == 503:
                raise ServiceUnavailable(fault.message) from None
            raise exceptions.AuthenticationFailed(fault.message) from None
        if principal.anonymous:
            raise exceptions.AuthenticationFailed("malformed HTTP Basic credentials")
        return principal
    raise exceptions.AuthenticationFailed(f"unsupported authorization scheme '{scheme}'")


def _body(data: bytes, ctype: str) -> Any:
    if ctype.split(";", 1)[0].strip().lower() in XML_TYPES:
        return {"xml": data.decode("utf-8", errors="replace")}
    try:
        return json.loads(data)
    except ValueError as exc:
        raise exceptions.ParseError(f"JSON parse error - {exc}") from None


def _problem(
    code: int, body: dict[str, Any], headers: tuple[tuple[str, str], ...] = ()
) -> Exchange:
    return Exchange(code, CONTENT_TYPE, json.dumps(body).encode(), headers)


def too_large(limit: int) -> Exchange:
    """413, with Connection: close so that the server stops reading (as for SOAP)."""
    code, body = api_problem(RequestTooLarge(f"request exceeds the limit of {limit} bytes"))
    return _problem(code, body, (("Connection", "close"),))


async def publish_exchange(
    *,
    topic: str,
    data: bytes,
    ctype: str,
    authorization: str,
    idempotency_key: str | None,
    client: str,
) -> Exchange:
    """Authenticate, throttle, publish; the 202 or the problem, as the DRF view answers."""
    try:
        principal = await _principal(authorization, client)
        ident = principal.name or f"anon@{client}"
        wait = await throttle_hit_async(scope="publish", ident=ident)
        if wait is not None:
            raise exceptions.Throttled(wait)
        ids = await publish_accept(
            topic=topic,
            data=_body(data, ctype),
            principal=principal,
            key=idempotency_key,
            client=client,
        )
    except errors.WsnError as exc:
        return _problem(*wsn_problem(exc))
    except ResourceBusy as exc:  # a lock held its database work too long: nothing was stored
        return _problem(*api_problem(ServiceUnavailable(str(exc))), (("Retry-After", "1"),))
    except exceptions.APIException as exc:
        code, body = api_problem(exc)
        headers: tuple[tuple[str, str], ...] = ()
        if isinstance(exc, exceptions.AuthenticationFailed | exceptions.NotAuthenticated):
            scheme = "Basic" if authorization.lower().startswith("basic") else "Bearer"
            headers = (("WWW-Authenticate", f'{scheme} realm="hpwsn"'),)
        if isinstance(exc, exceptions.Throttled) and exc.wait is not None:
            headers = (("Retry-After", str(int(exc.wait))),)
        return _problem(code, body, headers)
    except Exception:
        log.exception("unexpected error while publishing over REST")
        body = {
            "type": "urn:hpwsn:problem:error",
            "title": "Internal error",
            "status": 500,
            "detail": "internal error; the request was not processed",
        }
        return _problem(500, body)
    out = json.dumps({"topic": topic, "ids": ids}).encode()
    return Exchange(202, "application/json", out)
