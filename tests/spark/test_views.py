"""The analytics page's edges in process: who may read and who may start, CSV, bad input."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.utils import timezone

from spark.models import AnalyticsRun, JobResult

pytestmark = pytest.mark.django_db
LOCAL = "django.contrib.auth.backends.ModelBackend"  # no directory in these tests


def _user(name: str, group: str | None) -> User:
    user = User.objects.create_user(name, password="pw-" + name)
    if group:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    return user


@pytest.fixture
def run() -> AnalyticsRun:
    r = AnalyticsRun.objects.create(
        since=datetime(2026, 11, 1, tzinfo=UTC),
        until=datetime(2026, 11, 2, tzinfo=UTC),
        jobs=["top_n"],
        status=AnalyticsRun.Status.SUCCEEDED,
        input_rows=10,
    )
    JobResult.objects.create(
        run=r,
        job="top_n",
        status=JobResult.Status.SUCCEEDED,
        columns=["ranking", "rank", "key", "value"],
        rows=[
            ["topics_by_volume", 1, "ALL:A, with comma", 7.0],
            ["topics_by_volume", 2, "ALL:B", None],
        ],
        output_rows=2,
    )
    return r


def test_it_sends_anonymous_visitors_to_the_login(client):  # type: ignore[no-untyped-def]
    res = client.get("/analytics/")
    assert res.status_code == 302
    assert res["Location"].startswith("/console/login/")


def test_a_user_without_a_role_may_not_read(client):  # type: ignore[no-untyped-def]
    client.force_login(_user("nobody", None), backend=LOCAL)
    assert client.get("/analytics/").status_code == 403


def test_an_analyst_reads_the_page_and_the_csv_but_may_not_start_a_run(client, run):  # type: ignore[no-untyped-def]
    client.force_login(_user("ana", "hpwsn-analysts"), backend=LOCAL)
    page = client.get("/analytics/")
    assert page.status_code == 200
    body = page.content.decode()
    assert 'id="run-readonly"' in body
    assert 'id="run-form"' not in body
    assert "ALL:A, with comma" in body  # the rows, for the charts

    res = client.get(f"/analytics/runs/{run.id}/top_n.csv")
    assert res.status_code == 200
    rows = list(csv.reader(io.StringIO(b"".join(res.streaming_content).decode())))
    assert rows == [
        ["ranking", "rank", "key", "value"],
        ["topics_by_volume", "1", "ALL:A, with comma", "7.0"],
        ["topics_by_volume", "2", "ALL:B", ""],
    ]
    assert client.get(f"/analytics/runs/{run.id}/nojob.csv").status_code == 404

    refused = client.post(
        "/analytics/runs/", {"since": "2026-11-01T00:00", "until": "2026-11-02T00:00"}
    )
    assert refused.status_code == 403
    assert refused["Content-Type"] == "application/problem+json"
    assert json.loads(refused.content)["status"] == 403
    assert AnalyticsRun.objects.count() == 1


def test_an_operator_starts_a_run_as_a_task(client, django_capture_on_commit_callbacks, request):  # type: ignore[no-untyped-def]
    # The tasks this test sent (tests/conftest.py keeps them when no platform runs).
    sent = request.getfixturevalue("_tasks_of_tests_without_the_platform")
    client.force_login(_user("op", "hpwsn-operators"), backend=LOCAL)
    with django_capture_on_commit_callbacks(execute=True):
        res = client.post(
            "/analytics/runs/",
            {
                "since": "2026-11-01T00:00:00+00:00",
                "until": "2026-11-02T00:00:00+00:00",
                "job": ["traffic", "sizes"],
            },
        )
    assert res.status_code == 202, res.content
    run = AnalyticsRun.objects.get(id=res.json()["id"])
    assert run.jobs == ["traffic", "sizes"]
    assert run.trigger == AnalyticsRun.Trigger.WEB
    assert run.requested_by is not None
    assert run.requested_by.username == "op"
    assert sent == [("spark.tasks.analytics_run", (str(run.id),))]


@pytest.mark.parametrize(
    ("form", "detail"),
    [
        ({"since": "yesterday", "until": "2026-11-02T00:00"}, "not an ISO 8601 time"),
        ({"since": "2026-11-03T00:00", "until": "2026-11-02T00:00"}, "until must be after since"),
        ({"until": "2026-11-02T00:00"}, "since is required"),
        (
            {"since": "2026-11-01T00:00", "until": "2026-11-02T00:00", "job": "drop_tables"},
            "unknown job",
        ),
    ],
)
def test_a_bad_run_request_is_a_problem_and_stores_nothing(client, form, detail):  # type: ignore[no-untyped-def]
    client.force_login(_user("op2", "hpwsn-operators"), backend=LOCAL)
    res = client.post("/analytics/runs/", form)
    assert res.status_code == 400
    assert res["Content-Type"] == "application/problem+json"
    assert detail in res.json()["detail"]
    assert AnalyticsRun.objects.count() == 0


def _waiting_run(status: str = AnalyticsRun.Status.QUEUED) -> AnalyticsRun:
    return AnalyticsRun.objects.create(
        since=datetime(2026, 11, 1, tzinfo=UTC),
        until=datetime(2026, 11, 2, tzinfo=UTC),
        jobs=["traffic"],
        status=status,
    )


def test_a_run_beyond_the_queued_limit_is_refused_on_the_page(client, settings):  # type: ignore[no-untyped-def]
    settings.HPWSN_ANALYTICS_MAX_QUEUED = 3
    client.force_login(_user("op3", "hpwsn-operators"), backend=LOCAL)
    form = {"since": "2026-11-01T00:00:00+00:00", "until": "2026-11-02T00:00:00+00:00"}
    first = _waiting_run()
    _waiting_run()
    _waiting_run(AnalyticsRun.Status.RUNNING)
    # Lost with its worker a day ago (past the Spark lease's life): it holds nothing and waits
    # for nothing, so it is not counted.
    lost = _waiting_run(AnalyticsRun.Status.RUNNING)
    AnalyticsRun.objects.filter(id=lost.id).update(created_at=timezone.now() - timedelta(days=1))

    res = client.post("/analytics/runs/", form)

    assert res.status_code == 409
    assert res["Content-Type"] == "application/problem+json"
    assert "HPWSN_ANALYTICS_MAX_QUEUED" in res.json()["detail"]
    assert AnalyticsRun.objects.count() == 4
    # One ends: there is room for one more, and then none again.
    AnalyticsRun.objects.filter(id=first.id).update(status=AnalyticsRun.Status.FAILED)
    assert client.post("/analytics/runs/", form).status_code == 202
    assert client.post("/analytics/runs/", form).status_code == 409
