from celery import shared_task

from federation import services


@shared_task(ignore_result=True, expires=10)
def federation_sync() -> None:
    """Keep this site's links at its peers in step with its subscribers (and heartbeat them)."""
    services.federation_sync()
