"""The dashboard page, Prometheus /metrics and the load balancers' /healthz."""

from __future__ import annotations

import hmac
import ipaddress
from pathlib import Path

from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hpwsn_site.clients import request_client
from monitoring import selectors
from monitoring.metrics import registry


@staff_member_required
@require_GET
def dashboard(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "monitoring/dashboard.html",
        {
            "monitoring_enabled": settings.HPWSN_MONITORING,
            "heartbeat_s": settings.HPWSN_HEARTBEAT_S,
            "dead_after_s": settings.HPWSN_NODE_DEAD_AFTER_S,
        },
    )


def _scraper_refused(request: HttpRequest) -> HttpResponse | None:
    """With HPWSN_METRICS_TOKEN, anyone but its bearer is refused; without, anyone but a caller
    on this machine: the figures name topics, consumer hosts and the site's servers, which a web
    server listening beyond loopback would otherwise show to anyone."""
    token = settings.HPWSN_METRICS_TOKEN
    if token:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), token.encode()):
            return HttpResponse("unauthorized\n", status=401, content_type="text/plain")
    elif not _loopback(request_client(request.META)):
        return HttpResponse(
            "set HPWSN_METRICS_TOKEN to scrape from another machine\n",
            status=403,
            content_type="text/plain",
        )
    return None


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    refused = _scraper_refused(request)
    if refused is not None:
        return refused
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


async def healthz(request: HttpRequest) -> JsonResponse:
    """200 while the database and Redis answer (degraded without workers), 503 otherwise. The
    checks' details (errors naming servers and accounts, the directory's URL) for whoever may
    scrape /metrics; a load balancer elsewhere gets each check's status."""
    report = await selectors.health_check()
    if _scraper_refused(request) is not None:
        checks = {name: {"status": c["status"]} for name, c in report["checks"].items()}
        report = {"status": report["status"], "checks": checks}
    return JsonResponse(report, status=503 if report["status"] == "down" else 200)


# Third-party browser code shipped in the repository (each with its licence and origin beside it):
# the pages work offline, and no page loads code from a CDN.
VENDOR_DIR = Path(__file__).resolve().parent / "vendor"
VENDOR_FILES = {"chart.umd.min.js": VENDOR_DIR / "chartjs" / "chart.umd.min.js"}


@require_GET
def vendor_asset(request: HttpRequest, name: str) -> FileResponse:
    path = VENDOR_FILES.get(name)
    if path is None:
        raise Http404("no such file")
    response = FileResponse(path.open("rb"), content_type="text/javascript; charset=utf-8")
    response["Cache-Control"] = "public, max-age=86400"
    return response
