"""/api/v1/analytics: the Spark analytics runs, the same services as the analysts' page.

Analysts, operators and admins read runs and their results; operators and admins start runs,
as on the page (spark/views.py): `analytics_run_create`, then the Celery task
`spark.tasks.analytics_run` once the row is committed.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from drf_spectacular.utils import OpenApiExample, extend_schema, extend_schema_view
from rest_framework import generics, serializers
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from hpwsn_site.api.auth import principal_of
from hpwsn_site.api.exceptions import Conflict
from hpwsn_site.api.permissions import OperatorsWriteAnalystsRead
from hpwsn_site.api.schema import problem_responses
from spark import selectors
from spark.jobs import JOBS
from spark.models import AnalyticsRun, JobResult
from spark.services import RunRefused, RunsQueued, analytics_run_create
from spark.tasks import analytics_run


class RunIn(serializers.Serializer):
    since = serializers.DateTimeField(help_text="start of the range (ISO 8601; UTC if no zone)")
    until = serializers.DateTimeField(help_text="end of the range, excluded")
    jobs = serializers.ListField(
        child=serializers.ChoiceField(choices=JOBS),
        required=False,
        max_length=len(JOBS),
        help_text="which jobs, in run order; none = every job",
    )


class RunOut(serializers.Serializer):
    id = serializers.UUIDField()
    status = serializers.ChoiceField(choices=AnalyticsRun.Status.choices)
    trigger = serializers.CharField()
    jobs = serializers.ListField(child=serializers.CharField())
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    requested_by = serializers.CharField(allow_null=True)
    input_rows = serializers.IntegerField(allow_null=True, help_text="events read")
    duration_s = serializers.FloatField(allow_null=True)
    error = serializers.CharField()
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    progress_ws = serializers.CharField(help_text="WebSocket path of the run's live progress")


class ResultOut(serializers.Serializer):
    job = serializers.CharField()
    status = serializers.CharField()
    input_rows = serializers.IntegerField()
    output_rows = serializers.IntegerField()
    duration_s = serializers.FloatField()
    error = serializers.CharField()
    columns = serializers.ListField(child=serializers.CharField())
    rows = serializers.ListField(
        child=serializers.ListField(child=serializers.JSONField()), help_text="in `columns` order"
    )
    truncated = serializers.BooleanField(help_text="more rows than HPWSN_ANALYTICS_MAX_ROWS")


class RunDetailOut(RunOut):
    results = ResultOut(many=True)


def run_out(run: AnalyticsRun) -> dict[str, Any]:
    return {
        "id": str(run.id),
        "status": run.status,
        "trigger": run.trigger,
        "jobs": list(run.jobs),
        "since": run.since,
        "until": run.until,
        "requested_by": run.requested_by.get_username() if run.requested_by else None,
        "input_rows": run.input_rows,
        "duration_s": run.duration_s,
        "error": run.error,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "progress_ws": f"/ws/analytics/runs/{run.id}/",
    }


def result_out(result: JobResult) -> dict[str, Any]:
    return {
        "job": result.job,
        "status": result.status,
        "input_rows": result.input_rows,
        "output_rows": result.output_rows,
        "duration_s": result.duration_s,
        "error": result.error,
        "columns": result.columns,
        "rows": result.rows,
        "truncated": result.truncated,
    }


class ByCreation(CursorPagination):
    ordering = ("-created_at", "-id")
    page_size = 30
    max_page_size = 200
    page_size_query_param = "limit"


@extend_schema_view(
    get=extend_schema(
        operation_id="analytics_runs_list",
        summary="Analytics runs, newest first (analysts, operators, admins)",
        responses={200: RunOut(many=True), **problem_responses(400, 401, 403, 429)},
    ),
    post=extend_schema(
        operation_id="analytics_run_start",
        summary="Start an analytics run (operators, admins)",
        description=(
            "Queued as on the analysts' page; answered 202 with the queued run. Follow it with "
            "GET /analytics/{id} or the WebSocket at `progress_ws`. One run holds Spark at a "
            "time: a run started while another runs ends as failed, with the reason. 409 while "
            "HPWSN_ANALYTICS_MAX_QUEUED runs are queued or running."
        ),
        request=RunIn,
        responses={202: RunOut, **problem_responses(400, 401, 403, 409, 429)},
        examples=[
            OpenApiExample(
                "latency and traffic of one day",
                {
                    "since": "2026-11-23T00:00:00Z",
                    "until": "2026-11-24T00:00:00Z",
                    "jobs": ["latency", "traffic"],
                },
            ),
        ],
    ),
)
class RunListView(generics.ListAPIView):
    permission_classes = [OperatorsWriteAnalystsRead]
    serializer_class = RunOut
    pagination_class = ByCreation

    def get_queryset(self) -> Any:
        return AnalyticsRun.objects.select_related("requested_by")

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response([run_out(r) for r in page or []])

    def post(self, request: Request) -> Response:
        data = RunIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        name = principal_of(request).name
        user = get_user_model().objects.filter(username=name).first() if name else None
        try:
            run = analytics_run_create(
                since=v["since"],
                until=v["until"],
                jobs=v.get("jobs") or JOBS,
                trigger=AnalyticsRun.Trigger.WEB,
                user=user,
            )
        except RunsQueued as exc:
            raise Conflict(str(exc)) from None
        except RunRefused as exc:
            raise ValidationError(str(exc)) from None
        transaction.on_commit(lambda: analytics_run.delay(str(run.id)))
        return Response(run_out(run), status=202)


class RunView(APIView):
    permission_classes = [OperatorsWriteAnalystsRead]

    @extend_schema(
        operation_id="analytics_run_get",
        summary="An analytics run with each job's result rows",
        responses={200: RunDetailOut, **problem_responses(401, 403, 404, 429)},
    )
    def get(self, request: Request, run_id: str) -> Response:
        try:
            key = uuid.UUID(run_id)
        except ValueError:
            raise NotFound(f"no analytics run {run_id}") from None
        run = AnalyticsRun.objects.select_related("requested_by").filter(id=key).first()
        if run is None:
            raise NotFound(f"no analytics run {run_id}")
        results = selectors.job_results(run=run)
        ordered = [results[j] for j in run.jobs if j in results]
        ordered += [r for j, r in results.items() if j not in run.jobs]
        return Response({**run_out(run), "results": [result_out(r) for r in ordered]})
