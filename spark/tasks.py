from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from spark.models import AnalyticsRun
from spark.services import (
    analytics_run_create,
    analytics_run_execute,
    analytics_runs_prune,
    event_log_tidy,
)


@shared_task(acks_late=False, ignore_result=True)
def analytics_run(run_id: str) -> None:
    """Run a queued analytics run (not acked late: a run killed midway is not re-run blindly)."""
    analytics_run_execute(run_id=run_id)


@shared_task(ignore_result=True)
def analytics_nightly() -> None:
    """Every job over the last HPWSN_ANALYTICS_NIGHTLY_DAYS days."""
    until = timezone.now()
    run = analytics_run_create(
        since=until - timedelta(days=settings.HPWSN_ANALYTICS_NIGHTLY_DAYS),
        until=until,
        trigger=AnalyticsRun.Trigger.SCHEDULE,
    )
    analytics_run_execute(run_id=str(run.id))
    analytics_runs_prune()


@shared_task(ignore_result=True)
def events_housekeeping() -> None:
    """Compress abandoned hour files and apply the event log's retention."""
    event_log_tidy()
