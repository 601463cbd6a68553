"""A run: the jobs' Parquet under var/analytics/<run id>/, a summary and rows in the database,
progress reported as it goes, one run at a time."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hpwsn_site import state
from spark import keys
from spark.models import AnalyticsRun, JobResult
from spark.services import analytics_run_create, analytics_run_execute
from tests.spark import handbuilt as hb

pytestmark = pytest.mark.django_db


@pytest.fixture
def log_uri(tmp_path_factory, settings):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("runner-events")
    hb.write(root)
    settings.HPWSN_EVENTS_URI = root.as_uri()
    settings.HPWSN_ANALYTICS_DIR = tmp_path_factory.mktemp("analytics")
    state.get_redis().delete(keys.LEASE)
    return root


def _run(jobs: list[str]) -> AnalyticsRun:
    return analytics_run_create(
        since=datetime.fromtimestamp(hb.T0, tz=UTC),
        until=datetime.fromtimestamp(hb.UNTIL, tz=UTC),
        jobs=jobs,
    )


def test_a_run_writes_parquet_and_records_its_results(spark, log_uri, settings):  # type: ignore[no-untyped-def]
    run = _run(["sizes", "top_n"])
    reports: list[dict] = []  # type: ignore[type-arg]
    done = analytics_run_execute(run_id=str(run.id), spark=spark, on_progress=reports.append)

    assert done.status == AnalyticsRun.Status.SUCCEEDED, done.error
    assert done.input_rows == len(hb.in_run(hb.events()))
    assert done.duration_s is not None
    assert done.finished_at is not None
    out = Path(settings.HPWSN_ANALYTICS_DIR) / str(run.id)
    assert sorted(p.name for p in out.iterdir()) == ["sizes", "top_n"]
    assert list((out / "sizes").glob("*.parquet"))
    # The closed hours of the range were compacted to Parquet on the way, each with its manifest.
    assert list((log_uri / "_compact").glob("date=2026-11-02/hour=10/_manifest.json"))
    assert list((log_uri / "_compact").glob("date=2026-11-02/hour=10/*.parquet"))
    results = {r.job: r for r in JobResult.objects.filter(run=run)}
    assert set(results) == {"sizes", "top_n"}
    top = results["top_n"]
    assert top.columns == ["ranking", "rank", "key", "value"]
    assert ["publishers_by_refusals", 1, "mallory", 1.0] in top.rows
    assert top.output_rows == len(top.rows)
    # Progress: each job started and ended in order, then the final state; Redis keeps the last.
    assert next(r["job"] for r in reports if "job" in r) == "read"
    assert {r.get("job") for r in reports} >= {"read", "sizes", "top_n"}
    assert reports[-1]["state"] == "succeeded"
    assert reports[-1]["fraction"] == 1
    assert b"succeeded" in state.get_redis().get(keys.progress_key(str(run.id)))
    assert not state.get_redis().exists(keys.LEASE)


def test_a_run_while_another_holds_spark_is_recorded_as_refused(spark, log_uri):  # type: ignore[no-untyped-def]
    state.get_redis().set(keys.LEASE, "someone-else", ex=60)
    try:
        done = analytics_run_execute(run_id=str(_run(["sizes"]).id), spark=spark)
    finally:
        state.get_redis().delete(keys.LEASE)
    assert done.status == AnalyticsRun.Status.FAILED
    assert done.error == "another analytics run is in progress"
    assert not JobResult.objects.filter(run=done).exists()


def test_a_failing_job_fails_the_run_and_says_why(spark, log_uri, settings):  # type: ignore[no-untyped-def]
    settings.HPWSN_ANALYTICS_DIR = Path("/proc/hpwsn-cannot-write-here")
    done = analytics_run_execute(run_id=str(_run(["sizes"]).id), spark=spark)
    assert done.status == AnalyticsRun.Status.FAILED
    result = JobResult.objects.get(run=done, job="sizes")
    assert result.status == JobResult.Status.FAILED
    assert result.error.startswith("sizes: ")
    assert done.error == result.error


def test_a_run_holds_spark_by_a_short_lease_it_renews_and_fails_a_run_whose_worker_stopped(
    spark, log_uri, monkeypatch
):  # type: ignore[no-untyped-def]
    # The lease was taken for six hours and never renewed: a worker killed in a run (a restart)
    # kept every run from Spark for six hours, and its run stayed "running" for ever.
    from spark import services

    monkeypatch.setattr(services, "LEASE_TTL_S", 0.6)  # renewed every 0.2 s
    r = state.get_redis()
    stopped = _run(["sizes"])
    AnalyticsRun.objects.filter(id=stopped.id).update(status=AnalyticsRun.Status.RUNNING)
    seen: list[tuple[int, bool]] = []

    def slow(report: dict[str, object]) -> None:
        if not seen:
            time.sleep(1.5)  # longer than the lease's life: only its renewals keep it
        seen.append((r.pttl(keys.LEASE), r.exists(keys.LEASE) == 1))

    done = analytics_run_execute(run_id=str(_run(["sizes"]).id), spark=spark, on_progress=slow)

    assert done.status == AnalyticsRun.Status.SUCCEEDED, done.error
    assert all(held for _ttl, held in seen[:-1])  # held to the end of the run
    assert max(ttl for ttl, _held in seen[:-1]) <= 600
    stopped.refresh_from_db()
    assert stopped.status == AnalyticsRun.Status.FAILED
    assert stopped.error == "its worker stopped before the run ended"
