"""The analysts' page: charts of a run's results, the run history, "run now" and CSV."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import wraps
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.db import transaction
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    JsonResponse,
    StreamingHttpResponse,
)
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from console.roles import can_change, can_view, role_label
from spark import selectors
from spark.jobs import JOBS
from spark.models import AnalyticsRun
from spark.services import RunRefused, RunsQueued, analytics_run_create
from spark.tasks import analytics_run

View = Callable[..., HttpResponse]


def _problem(status: int, title: str, detail: str) -> JsonResponse:
    """An RFC 9457 problem response."""
    return JsonResponse(
        {"type": "about:blank", "title": title, "status": status, "detail": detail},
        status=status,
        content_type="application/problem+json",
    )


def analytics_view(*, start: bool = False) -> Callable[[View], View]:
    """Login required; analysts, operators and admins read; operators and admins start runs."""

    def decorate(view: View) -> View:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not request.user.is_authenticated:
                if start:
                    return _problem(401, "Not logged in", "log in to start an analytics run")
                return redirect_to_login(request.get_full_path(), reverse("console:login"))
            if not can_view(request.user) or (start and not can_change(request.user)):
                if start:
                    return _problem(
                        403, "Forbidden", "only operators and admins may start an analytics run"
                    )
                return render(
                    request,
                    "console/forbidden.html",
                    {"role": role_label(request.user)},
                    status=403,
                )
            return view(request, *args, **kwargs)

        return wrapper

    return decorate


@analytics_view()
@require_GET
def page(request: HttpRequest) -> HttpResponse:
    run_id = request.GET.get("run") or None
    if run_id:
        try:
            uuid.UUID(run_id)
        except ValueError:
            raise Http404("no such run") from None
    shown = selectors.analytics_run_shown(run_id=run_id)
    results = selectors.job_results(run=shown) if shown else {}
    data = {
        job: {"columns": r.columns, "rows": r.rows, "truncated": r.truncated, "error": r.error}
        for job, r in results.items()
    }
    now = timezone.now().astimezone(UTC).replace(second=0, microsecond=0)
    ctx = {
        "section": "analytics",
        "role": role_label(request.user),
        "can_change": can_change(request.user),
        "can_start": can_change(request.user),
        "runs": selectors.analytics_runs(),
        "shown": shown,
        "results": results,
        "jobs": JOBS,
        "chart_data": data,
        "default_since": (now - timedelta(days=7)).strftime("%Y-%m-%dT%H:%M"),
        "default_until": now.strftime("%Y-%m-%dT%H:%M"),
    }
    return render(request, "spark/analytics.html", ctx)


def _time(text: str | None, name: str) -> datetime:
    if not text:
        raise RunRefused(f"{name} is required")
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise RunRefused(f"{name} '{text[:40]}' is not an ISO 8601 time") from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


@analytics_view(start=True)
@require_POST
def run_start(request: HttpRequest) -> HttpResponse:
    """Queue a run as a Celery task; the page follows it on /ws/analytics/runs/<id>/."""
    try:
        run = analytics_run_create(
            since=_time(request.POST.get("since"), "since"),
            until=_time(request.POST.get("until"), "until"),
            jobs=request.POST.getlist("job") or JOBS,
            trigger=AnalyticsRun.Trigger.WEB,
            user=request.user,
        )
    except RunsQueued as exc:
        return _problem(409, "Too many analytics runs queued", str(exc))
    except RunRefused as exc:
        return _problem(400, "Invalid analytics run", str(exc))
    transaction.on_commit(lambda: analytics_run.delay(str(run.id)))
    return JsonResponse(
        {
            "id": str(run.id),
            "status": run.status,
            "progress_ws": f"/ws/analytics/runs/{run.id}/",
            "page": reverse("analytics:page") + f"?run={run.id}",
        },
        status=202,
    )


@analytics_view()
@require_GET
def run_status(request: HttpRequest, run_id: uuid.UUID) -> JsonResponse:
    run = AnalyticsRun.objects.filter(id=run_id).first()
    if run is None:
        return _problem(404, "Not found", f"no analytics run {run_id}")
    return JsonResponse(
        {
            "id": str(run.id),
            "status": run.status,
            "input_rows": run.input_rows,
            "duration_s": run.duration_s,
            "error": run.error,
        }
    )


@analytics_view()
@require_GET
def result_csv(request: HttpRequest, run_id: uuid.UUID, job: str) -> HttpResponse:
    run = AnalyticsRun.objects.filter(id=run_id).first()
    result = selectors.job_results(run=run).get(job) if run else None
    if result is None:
        raise Http404("no such result")
    response = StreamingHttpResponse(
        selectors.job_result_csv(result=result), content_type="text/csv; charset=utf-8"
    )
    response["Content-Disposition"] = f'attachment; filename="{job}-{run_id}.csv"'
    return response
