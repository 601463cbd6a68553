"""The "ceiling" endpoint of bench/e2e.py: parse a SOAP request like /wsn/ does, answer 202.

It runs in the same uvicorn/Django stack as the real endpoint (same middleware, same async
view machinery, same hardened parse with the same limits) and does nothing else, so the
request rate it sustains is the ceiling the real Notify path can be compared with.

Mounted only when HPWSN_BENCH_ENDPOINTS=1 (hpwsn_site/urls.py appends `bench_urlpatterns()`).
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path
from django.views.decorators.csrf import csrf_exempt

from hpwsn.soap import (
    SoapFault,
    content_type,
    fault_envelope,
    fault_http_status,
    parse_request,
    soap_version_of,
)
from hpwsn_site.env import env_bool


def _fault(fault: SoapFault, version: str) -> HttpResponse:
    return HttpResponse(
        fault_envelope(fault, version=version),
        status=fault_http_status(fault, version),
        content_type=content_type(version),
    )


@csrf_exempt
async def bench_echo(request: HttpRequest) -> HttpResponse:
    """POST a SOAP envelope: 202 once it parses (same checks as /wsn/), a SOAP fault otherwise."""
    if request.method != "POST":
        return HttpResponse(status=405, headers={"Allow": "POST"})
    ctype = request.META.get("CONTENT_TYPE")
    version = soap_version_of(ctype)
    length = int(request.META.get("CONTENT_LENGTH") or 0)
    if length > settings.HPWSN_MAX_REQUEST_BYTES:
        return _fault(
            SoapFault(
                f"request of {length} bytes exceeds the limit of "
                f"{settings.HPWSN_MAX_REQUEST_BYTES}",
                http_status=413,
            ),
            version,
        )
    try:
        parse_request(
            request.body,
            max_bytes=settings.HPWSN_MAX_REQUEST_BYTES,
            max_depth=settings.HPWSN_MAX_XML_DEPTH,
            content_type=ctype,
        )
    except SoapFault as fault:
        return _fault(fault, version)
    return HttpResponse(status=202)


def bench_urlpatterns() -> list[URLPattern]:
    """The benchmark-only routes: empty unless HPWSN_BENCH_ENDPOINTS=1."""
    if not env_bool("HPWSN_BENCH_ENDPOINTS", False):
        return []
    return [path("bench/echo/", bench_echo)]
