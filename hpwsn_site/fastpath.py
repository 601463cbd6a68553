"""A thin ASGI route for SOAP POSTs to /wsn/: the publish hot path without Django's request cycle.

Django's ASGI handler costs about 1.8 ms of CPU per request on this hardware (request signals and
middleware adapted through threads), which alone capped the broker near 550 requests/s per core.
SOAP POSTs need none of it: no session, no CSRF, no template. This route reads the body with the
size limit enforced while reading, validates the Host header against ALLOWED_HOSTS, and calls the
same `soap_exchange` as the Django view. Everything else (GET ?wsdl, admin, the Spyne legacy
service) goes to Django.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.conf import settings
from django.http.request import split_domain_port, validate_host

from hpwsn.soap import SoapFault, parse_request, soap_version_of
from hpwsn_site.api import fastpublish
from hpwsn_site.clients import client_address
from hpwsn_site.env import env_bool
from hpwsn_site.soap import Exchange, fault_exchange, soap_exchange, too_large

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_SOAP_PATH = re.compile(r"^/wsn/(?:(subscriptions|pullpoints|registrations)/([^/]{1,128})/?)?$")
BENCH_ECHO = "/bench/echo/"


class _TooLarge(Exception):
    pass


def _client(scope: Scope) -> str:
    """The caller's address: the connection's, or what the proxies say (HPWSN_API_PROXIES)."""
    peer = (scope.get("client") or ("", 0))[0]
    forwarded = b",".join(v for k, v in scope.get("headers", []) if k.lower() == b"x-forwarded-for")
    return client_address(str(peer), forwarded.decode("latin-1") or None)


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionError("client disconnected")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _too_large(ctype: str | None) -> Exchange:
    """413 with Connection: close, so that the server stops reading the body it refused.

    Kept alive, uvicorn would read and discard the rest of the body, however long (an endless
    chunked body included). httpx, requests, aiohttp and curl all read the 413 that comes while
    they are still sending.
    """
    ex = too_large(soap_version_of(ctype))
    return dataclasses.replace(ex, headers=(*ex.headers, ("Connection", "close")))


@functools.lru_cache(maxsize=256)
def _served(host: str, allowed_hosts: tuple[str, ...]) -> bool:
    """Whether the Host header names a host of ALLOWED_HOSTS, as Django checks it; kept for the
    few hosts a site is reached by (the header is the client's, so the memo is bounded)."""
    domain, _port = split_domain_port(host)
    return bool(domain) and validate_host(domain, allowed_hosts)


def _scheme(scope: Scope, headers: dict[bytes, bytes]) -> str:
    """The scheme the client used: the connection's, or behind reverse proxies
    (HPWSN_API_PROXIES) the nearest one's X-Forwarded-Proto, as Django reads it for its pages."""
    if settings.HPWSN_API_PROXIES > 0:
        said = (
            headers.get(b"x-forwarded-proto", b"").decode("latin-1").split(",")[0].strip().lower()
        )
        if said in ("http", "https"):
            return said
    return str(scope.get("scheme", "http"))


def _headers(scope: Scope) -> dict[bytes, bytes]:
    return {k.lower(): v for k, v in scope.get("headers", [])}


async def _send(send: Send, ex: Exchange) -> None:
    headers = [(b"content-length", str(len(ex.body)).encode())]
    if ex.content_type:
        headers.append((b"content-type", ex.content_type.encode()))
    headers.extend((k.lower().encode(), v.encode("latin-1")) for k, v in ex.headers)
    await send({"type": "http.response.start", "status": ex.status, "headers": headers})
    await send({"type": "http.response.body", "body": ex.body})


async def _echo(data: bytes, ctype: str | None) -> Exchange:
    """The benchmark's ceiling: the same read and parse as /wsn/, then 202 and nothing else."""
    try:
        parse_request(
            data,
            max_bytes=settings.HPWSN_MAX_REQUEST_BYTES,
            max_depth=settings.HPWSN_MAX_XML_DEPTH,
            content_type=ctype,
        )
    except SoapFault as fault:
        return fault_exchange(fault, soap_version_of(ctype))
    return Exchange(202, None, b"")


API_PREFIX = "/api/v1/topics/"


async def _api_publish(scope: Scope, receive: Receive, send: Send, django_app: ASGIApp) -> None:
    """REST publish (hpwsn_site/api/fastpublish.py); anything it does not serve goes to Django."""
    headers = _headers(scope)
    text = {k: headers.get(k, b"").decode("latin-1") for k in (b"content-type", b"authorization")}
    topic = fastpublish.routed(
        path=scope["path"],
        ctype=text[b"content-type"],
        authorization=text[b"authorization"],
        cookie=headers.get(b"cookie", b"").decode("latin-1"),
    )
    host = headers.get(b"host", b"").decode("latin-1")
    if topic is None or not _served(host, tuple(settings.ALLOWED_HOSTS)):
        return await django_app(scope, receive, send)  # Django answers these (400 bad host, ...)
    limit = settings.HPWSN_MAX_REQUEST_BYTES
    declared = headers.get(b"content-length", b"")
    try:
        if declared.isdigit() and int(declared) > limit:
            raise _TooLarge
        data = await _read_body(receive, limit)
    except _TooLarge:
        return await _send(send, fastpublish.too_large(limit))
    except ConnectionError:
        return None
    ex = await fastpublish.publish_exchange(
        topic=topic,
        data=data,
        ctype=text[b"content-type"],
        authorization=text[b"authorization"],
        idempotency_key=headers.get(b"idempotency-key", b"").decode("latin-1") or None,
        client=_client(scope),
    )
    return await _send(send, ex)


def wrap(django_app: ASGIApp) -> ASGIApp:
    """The ASGI application: SOAP POSTs here, everything else to Django."""
    bench = env_bool("HPWSN_BENCH_ENDPOINTS", False)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await django_app(scope, receive, send)
        path = scope["path"]
        if path.startswith(API_PREFIX):
            return await _api_publish(scope, receive, send, django_app)
        m = _SOAP_PATH.match(path)
        if m is None and not (bench and path == BENCH_ECHO):
            return await django_app(scope, receive, send)
        headers = _headers(scope)
        ctype = headers.get(b"content-type", b"").decode("latin-1") or None
        host = headers.get(b"host", b"").decode("latin-1")
        if not _served(host, tuple(settings.ALLOWED_HOSTS)):
            fault = SoapFault(f"host '{host}' is not served here (ALLOWED_HOSTS)")
            return await _send(send, fault_exchange(fault, soap_version_of(ctype)))
        limit = settings.HPWSN_MAX_REQUEST_BYTES
        # A declared length over the limit is answered before a byte of the body is read (a client
        # that sent Expect: 100-continue then never sends it).
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            return await _send(send, _too_large(ctype))
        try:
            data = await _read_body(receive, limit)
        except _TooLarge:
            return await _send(send, _too_large(ctype))
        except ConnectionError:
            return None
        if m is None:
            return await _send(send, await _echo(data, ctype))
        base = settings.HPWSN_PUBLIC_URL.rstrip("/") or f"{_scheme(scope, headers)}://{host}"
        authorization = headers.get(b"authorization", b"").decode("latin-1") or None
        ex = await soap_exchange(
            data=data,
            ctype=ctype,
            base=base,
            resource_kind=m.group(1),
            resource_id=m.group(2),
            authorization=authorization,
            idempotency_key=headers.get(b"idempotency-key", b"").decode("latin-1") or None,
            client=_client(scope),
        )
        return await _send(send, ex)

    return app
