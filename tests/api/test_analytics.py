"""/api/v1/analytics on the running platform: runs, their results, and starting one."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from spark import keys
from tests.api.test_api import _problem
from tests.support import wait_until


def _finished_run() -> str:
    from spark.models import AnalyticsRun, JobResult

    run = AnalyticsRun.objects.create(
        since=datetime(2026, 11, 1, tzinfo=UTC),
        until=datetime(2026, 11, 2, tzinfo=UTC),
        jobs=["traffic", "top_n"],
        status=AnalyticsRun.Status.SUCCEEDED,
        input_rows=12,
        duration_s=3.5,
    )
    # Stored in another order than the run's: the API answers in the run's order.
    JobResult.objects.create(
        run=run,
        job="top_n",
        status=JobResult.Status.SUCCEEDED,
        columns=["ranking", "rank", "key", "value"],
        rows=[["topics_by_volume", 1, "ALL:A", 7.0], ["topics_by_volume", 2, "ALL:B", None]],
        output_rows=2,
        input_rows=12,
    )
    JobResult.objects.create(
        run=run,
        job="traffic",
        status=JobResult.Status.FAILED,
        error="AnalysisException: no column ts",
        input_rows=12,
    )
    return str(run.id)


def test_analysts_read_runs_with_their_results(api, committed):  # type: ignore[no-untyped-def]
    run_id = committed(_finished_run)

    listed = api.call("GET", "/analytics", "analyst1")
    assert listed.status_code == 200, listed.text
    row = next(r for r in listed.json()["results"] if r["id"] == run_id)
    assert (row["status"], row["jobs"], row["input_rows"]) == (
        "succeeded",
        ["traffic", "top_n"],
        12,
    )
    assert row["progress_ws"] == f"/ws/analytics/runs/{run_id}/"

    shown = api.call("GET", f"/analytics/{run_id}", "analyst1").json()
    assert [r["job"] for r in shown["results"]] == ["traffic", "top_n"]
    traffic, top_n = shown["results"]
    assert (traffic["status"], traffic["error"]) == ("failed", "AnalysisException: no column ts")
    assert top_n["columns"] == ["ranking", "rank", "key", "value"]
    assert top_n["rows"][1] == ["topics_by_volume", 2, "ALL:B", None]

    for user, status in ((None, 401), ("publisher1", 403), ("subscriber1", 403)):
        assert api.call("GET", f"/analytics/{run_id}", user).status_code == status
        assert api.call("GET", "/analytics", user).status_code == status
    _problem(api.call("GET", f"/analytics/{uuid.uuid4()}", "analyst1"), 404, "not-found")


@pytest.fixture
def spark_held(platform):  # type: ignore[no-untyped-def]
    """Hold the analytics lease as a run in progress would: a run started now is refused by
    the worker at once (no Spark session), with its reason recorded."""
    r = platform.redis()
    token = f"test-{uuid.uuid4().hex}"
    assert r.set(keys.LEASE, token, nx=True, ex=300)
    yield
    if r.get(keys.LEASE) == token.encode():
        r.delete(keys.LEASE)


def test_an_operator_starts_a_run_that_the_worker_takes(api, spark_held):  # type: ignore[no-untyped-def]
    body = {"since": "2026-11-20T00:00:00Z", "until": "2026-11-21T00:00:00Z", "jobs": ["latency"]}
    _problem(api.call("POST", "/analytics", "analyst1", json=body), 403, "forbidden")

    started = api.call("POST", "/analytics", "operator1", json=body)
    assert started.status_code == 202, started.text
    run = started.json()
    assert (run["status"], run["jobs"], run["trigger"]) == ("queued", ["latency"], "web")
    assert run["since"].startswith("2026-11-20T00:00:00")

    def shown() -> dict[str, object]:
        return api.call("GET", f"/analytics/{run['id']}", "analyst1").json()

    # The Celery worker took the task and found Spark busy: the run ends as failed, saying why.
    assert wait_until(lambda: shown()["status"] == "failed", timeout=30), shown()
    assert shown()["error"] == "another analytics run is in progress"


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"since": "2026-11-21T00:00:00Z", "until": "2026-11-20T00:00:00Z"}, "until must be"),
        ({"since": "2026-11-20T00:00:00Z", "until": "2026-11-21T00:00:00Z", "jobs": ["nope"]},
         "nope"),
        ({"since": "yesterday", "until": "2026-11-21T00:00:00Z"}, "since"),
    ],
)  # fmt: skip
def test_a_bad_run_request_is_a_problem_and_starts_nothing(api, body, detail, db_access):  # type: ignore[no-untyped-def]
    from spark.models import AnalyticsRun

    before = AnalyticsRun.objects.count()
    problem = _problem(api.call("POST", "/analytics", "operator1", json=body), 400, "validation")
    assert detail in problem["detail"]
    assert AnalyticsRun.objects.count() == before


@pytest.mark.django_db
def test_a_run_beyond_the_queued_limit_is_a_conflict(client, settings):  # type: ignore[no-untyped-def]
    """In process, with a local operator's console session (no directory)."""
    from django.contrib.auth.models import Group, User

    from spark.models import AnalyticsRun

    settings.HPWSN_LDAP_URL = ""
    settings.HPWSN_ANALYTICS_MAX_QUEUED = 2
    operator = User.objects.create_user("op-queue", password="pw-op-queue")
    operator.groups.add(Group.objects.get_or_create(name="hpwsn-operators")[0])
    client.force_login(operator, backend="django.contrib.auth.backends.ModelBackend")
    body = {"since": "2026-11-20T00:00:00Z", "until": "2026-11-21T00:00:00Z", "jobs": ["latency"]}

    def start() -> object:
        return client.post("/api/v1/analytics", body, content_type="application/json")

    assert start().status_code == 202
    assert start().status_code == 202
    refused = start()

    assert refused.status_code == 409, refused.content
    assert refused["Content-Type"] == "application/problem+json"
    problem = refused.json()
    assert problem["type"] == "urn:hpwsn:problem:conflict"
    assert "HPWSN_ANALYTICS_MAX_QUEUED" in problem["detail"]
    assert AnalyticsRun.objects.filter(status=AnalyticsRun.Status.QUEUED).count() == 2
