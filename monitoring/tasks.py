from celery import shared_task

from monitoring.services import snapshot_publish


@shared_task(ignore_result=True)
def stats_snapshot() -> None:
    """Compute this second's statistics, keep them for 15 minutes, push them to dashboards."""
    snapshot_publish()
