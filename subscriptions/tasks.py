from celery import shared_task


@shared_task(ignore_result=True)
def subscriptions_expire() -> None:
    """Free every subscription past its termination time."""
    from subscriptions.services import subscriptions_expire as run

    run()
