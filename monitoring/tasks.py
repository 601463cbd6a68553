from celery import shared_task


@shared_task(ignore_result=True)
def stats_snapshot() -> None:
    """Compute this second's statistics, keep them for 15 minutes, push them to dashboards."""
    from monitoring.services import snapshot_publish

    snapshot_publish()
