"""Analytics runs: create one, run its jobs on Spark, record results, report progress."""

from __future__ import annotations

import importlib
import json
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone

from hpwsn_site import state
from spark import keys
from spark.compaction import compact
from spark.eventlog import partitions_prune, stale_files_compress
from spark.jobs import JOBS
from spark.jobs.common import (
    JobConfig,
    for_jobs,
    local_root,
    read_events,
    session,
    session_end,
)
from spark.models import AnalyticsRun, JobResult
from spark.progress import Progress, Tracker

log = logging.getLogger(__name__)


# The range a run may cover (see analytics_run_create).
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 1, 1, tzinfo=UTC)


# A run queued or running for longer than this was lost with its worker and no longer counts as
# waiting (see _queue_full).
LEASE_S = 6 * 3600
# The life of the Redis lease a run holds Spark by, renewed every third of it while the run goes
# on: a worker killed in a run (a restart) holds Spark no longer than this, not for hours.
LEASE_TTL_S = 60.0
_RENEW = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then "
    "return redis.call('pexpire', KEYS[1], ARGV[2]) end"
)
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end"


class _LeaseKept(threading.Thread):
    """Renews a run's lease while it runs (Spark's jobs hold the worker's thread)."""

    def __init__(self, r: Any, token: str) -> None:
        super().__init__(name="hpwsn-analytics-lease", daemon=True)
        self.r, self.token, self.done = r, token, threading.Event()

    def run(self) -> None:
        while not self.done.wait(LEASE_TTL_S / 3):
            try:
                self.r.eval(_RENEW, 1, keys.LEASE, self.token, int(LEASE_TTL_S * 1000))
            except Exception:  # Redis away a moment: the next renewal tries again
                log.warning("analytics: the run's lease was not renewed", exc_info=True)


class RunRefused(Exception):
    """A run cannot start: another holds Spark, or the request is not valid."""


class RunsQueued(RunRefused):
    """A run cannot be queued: HPWSN_ANALYTICS_MAX_QUEUED runs are queued or running already."""


def _queue_full() -> str | None:
    """Why no run may be queued now, or None."""
    limit = settings.HPWSN_ANALYTICS_MAX_QUEUED
    if limit <= 0:
        return None
    # A run whose worker died stays queued or running in its row; counted for ever, a few of them
    # would refuse every run. Past the lease's life none of them can still hold or wait for Spark.
    waiting = AnalyticsRun.objects.filter(
        status__in=[AnalyticsRun.Status.QUEUED, AnalyticsRun.Status.RUNNING],
        created_at__gt=timezone.now() - timedelta(seconds=LEASE_S),
    )
    if waiting[:limit].count() < limit:
        return None
    return (
        f"{limit} analytics runs are queued or running, the most there may be "
        f"(HPWSN_ANALYTICS_MAX_QUEUED); wait for one to end"
    )


def analytics_run_create(
    *,
    since: datetime,
    until: datetime,
    jobs: Sequence[str] = JOBS,
    trigger: str = AnalyticsRun.Trigger.CLI,
    user: Any = None,
) -> AnalyticsRun:
    """Record a queued run of `jobs` over [since, until); refused (RunsQueued) while
    HPWSN_ANALYTICS_MAX_QUEUED runs are queued or running."""
    unknown = [j for j in jobs if j not in JOBS]
    if unknown:
        raise RunRefused(f"unknown job(s): {', '.join(unknown)}; known: {', '.join(JOBS)}")
    if not jobs:
        raise RunRefused("no job to run")
    if since.tzinfo is None or until.tzinfo is None:
        raise RunRefused("since and until must be aware datetimes")
    if until <= since:
        raise RunRefused("until must be after since")
    # The log's times are Unix seconds, and a run lists every hour of its range (and of the
    # period before it, for the regressions job): nothing is before 1970, and a range of
    # centuries would hold the Spark lease for many minutes before reading a line.
    if since < EARLIEST or until > LATEST:
        raise RunRefused(
            f"since and until must lie between {EARLIEST:%Y-%m-%d} and {LATEST:%Y-%m-%d}"
        )
    days = settings.HPWSN_ANALYTICS_MAX_DAYS
    if until - since > timedelta(days=days):
        raise RunRefused(
            f"the range covers {(until - since).total_seconds() / 86400:.1f} days; "
            f"at most {days} days (HPWSN_ANALYTICS_MAX_DAYS)"
        )
    # Counted, then inserted: runs queued at the same instant may pass the bound by as many.
    full = _queue_full()
    if full is not None:
        raise RunsQueued(full)
    return AnalyticsRun.objects.create(
        jobs=list(dict.fromkeys(jobs)),  # a job named twice runs once
        since=since,
        until=until,
        trigger=trigger,
        requested_by=user if getattr(user, "is_authenticated", False) else None,
        master=settings.HPWSN_SPARK_MASTER,
    )


def _publish(run_id: str, payload: dict[str, Any]) -> None:
    """The run's progress to Redis (for late joiners) and to the pages watching it."""
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    body = json.dumps(payload)
    try:
        state.get_redis().set(keys.progress_key(run_id), body, ex=3600)
        layer = get_channel_layer()
        if layer is not None:
            async_to_sync(layer.group_send)(
                keys.group(run_id), {"type": "analytics.progress", "progress": payload}
            )
    except Exception:  # progress is a courtesy: a Redis hiccup must not fail the run
        log.warning("could not publish the progress of run %s", run_id, exc_info=True)


def _rows(df: Any, limit: int) -> tuple[list[str], list[list[Any]], bool]:
    """Columns and up to `limit` rows, as Spark's JSON writes them (timestamps in UTC)."""
    from pyspark.sql import functions as F

    columns = list(df.columns)
    lines = [r[0] for r in df.select(F.to_json(F.struct(*columns))).take(limit + 1)]
    rows = []
    for line in lines[:limit]:
        obj = json.loads(line)  # to_json leaves null fields out
        rows.append([obj.get(c) for c in columns])
    return columns, rows, len(lines) > limit


def analytics_run_execute(
    *,
    run_id: str,
    spark: Any = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
) -> AnalyticsRun:
    """Run a queued run's jobs; results go to Parquet and the database. One run at a time.

    `spark` reuses a session (tests); otherwise one is started on HPWSN_SPARK_MASTER and stopped
    at the end, so that a worker does not keep a JVM between nightly runs.
    """
    run = AnalyticsRun.objects.get(id=uuid.UUID(str(run_id)))
    r = state.get_redis()
    token = uuid.uuid4().hex
    if not r.set(keys.LEASE, token, nx=True, px=int(LEASE_TTL_S * 1000)):
        run.status = AnalyticsRun.Status.FAILED
        run.error = "another analytics run is in progress"
        run.finished_at = timezone.now()
        run.save(update_fields=["status", "error", "finished_at"])
        _publish(str(run.id), {"state": "failed", "error": run.error, "fraction": 0})
        return run

    def report(p: Progress | dict[str, Any]) -> None:
        payload = p.as_dict() if isinstance(p, Progress) else p
        _publish(str(run.id), payload)
        if on_progress is not None:
            on_progress(payload)

    started = time.monotonic()
    run.status = AnalyticsRun.Status.RUNNING
    run.started_at = timezone.now()
    run.save(update_fields=["status", "started_at"])
    own_session = spark is None
    out = Path(settings.HPWSN_ANALYTICS_DIR) / str(run.id)
    kept = _LeaseKept(r, token)
    kept.start()
    try:
        # This run holds Spark: a run still marked running holds nothing any more, its worker
        # stopped before it ended.
        AnalyticsRun.objects.filter(status=AnalyticsRun.Status.RUNNING).exclude(id=run.id).update(
            status=AnalyticsRun.Status.FAILED,
            error="its worker stopped before the run ended",
            finished_at=timezone.now(),
        )
        if own_session:
            spark = session(
                master=settings.HPWSN_SPARK_MASTER,
                conf={
                    "spark.sql.shuffle.partitions": str(settings.HPWSN_SPARK_SHUFFLE_PARTITIONS),
                    "spark.driver.memory": settings.HPWSN_SPARK_DRIVER_MEMORY,
                },
            )
        cfg = JobConfig(since=run.since.timestamp(), until=run.until.timestamp())
        widest = cfg.previous_since if "regressions" in run.jobs else cfg.since
        uri = settings.HPWSN_EVENTS_URI
        with Tracker(spark.sparkContext, jobs_total=len(run.jobs) + 1, report=report) as tracker:
            tracker.start_job("read")
            root = local_root(uri)
            if root is not None and settings.HPWSN_EVENTS_COMPACT:
                compact(spark, root=root, since=widest, until=cfg.until)
            # The topic joins of every job, once, and only the columns jobs read, cached.
            events = for_jobs(read_events(spark, uri=uri, since=widest, until=cfg.until))
            events = events.persist()
            in_range = events.where(events.ts >= cfg.since)
            run.input_rows = in_range.count()
            run.save(update_fields=["input_rows"])
            tracker.end_job()
            failures = []
            for name in run.jobs:
                tracker.start_job(name)
                failures += _job_run(name, run=run, events=events, cfg=cfg, out=out)
                tracker.end_job()
            events.unpersist()
        run.status = AnalyticsRun.Status.FAILED if failures else AnalyticsRun.Status.SUCCEEDED
        run.error = "; ".join(failures)
    except Exception as exc:
        log.exception("analytics run %s failed", run.id)
        run.status = AnalyticsRun.Status.FAILED
        run.error = f"{type(exc).__name__}: {exc}"[:4000]
    finally:
        if own_session and spark is not None:
            session_end(spark)
        kept.done.set()
        kept.join()
        r.eval(_RELEASE, 1, keys.LEASE, token)
    run.duration_s = round(time.monotonic() - started, 3)
    run.finished_at = timezone.now()
    run.save(update_fields=["status", "error", "duration_s", "finished_at"])
    report(
        {
            "state": run.status,
            "error": run.error,
            "fraction": 1 if run.status == AnalyticsRun.Status.SUCCEEDED else 0,
            "input_rows": run.input_rows,
            "duration_s": run.duration_s,
        }
    )
    return run


def _job_run(name: str, *, run: AnalyticsRun, events: Any, cfg: JobConfig, out: Path) -> list[str]:
    """One job of the run; returns its error (as a one-item list) or nothing."""
    module = importlib.import_module(f"spark.jobs.{name}")
    started = time.monotonic()
    try:
        df = module.transform(events, cfg=cfg)
        path = module.load(df, out=str(out))
        stored = df.sparkSession.read.parquet(path)
        columns, rows, truncated = _rows(stored, settings.HPWSN_ANALYTICS_MAX_ROWS)
        JobResult.objects.update_or_create(
            run=run,
            job=name,
            defaults={
                "status": JobResult.Status.SUCCEEDED,
                "input_rows": run.input_rows or 0,
                "output_rows": stored.count() if truncated else len(rows),
                "duration_s": round(time.monotonic() - started, 3),
                "error": "",
                "columns": columns,
                "rows": rows,
                "truncated": truncated,
            },
        )
        return []
    except Exception as exc:
        log.exception("analytics job %s of run %s failed", name, run.id)
        error = f"{name}: {type(exc).__name__}: {str(exc)[:1000]}"
        JobResult.objects.update_or_create(
            run=run,
            job=name,
            defaults={
                "status": JobResult.Status.FAILED,
                "duration_s": round(time.monotonic() - started, 3),
                "error": error,
            },
        )
        return [error]


def analytics_runs_prune(*, keep: int = 50) -> int:
    """Keep the newest `keep` runs and their Parquet; older ones go."""
    old = list(AnalyticsRun.objects.order_by("-created_at").values_list("id", flat=True)[keep:])
    for run_id in old:
        shutil.rmtree(Path(settings.HPWSN_ANALYTICS_DIR) / str(run_id), ignore_errors=True)
    AnalyticsRun.objects.filter(id__in=old).delete()
    return len(old)


def event_log_tidy() -> tuple[int, int]:
    """Compress the hour files crashed processes left open; drop partitions past retention."""
    root = Path(settings.HPWSN_EVENTS_DIR)
    if not root.exists():
        return 0, 0
    now = time.time()
    compressed = stale_files_compress(root, now=now)
    pruned = partitions_prune(root, now=now, keep_days=settings.HPWSN_EVENTS_RETENTION_DAYS)
    return compressed, pruned
