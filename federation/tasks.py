from celery import shared_task


@shared_task(ignore_result=True, expires=10)
def federation_sync() -> None:
    """Keep this site's links at its peers in step with its subscribers (and heartbeat them)."""
    from federation.services import federation_sync as sync

    sync()
