from celery import shared_task

# The services import late: subscriptions/registrations.py imports this module to queue its tasks.


@shared_task(ignore_result=True)
def subscriptions_expire() -> None:
    """Free every subscription past its termination time."""
    from subscriptions.services import subscriptions_expire as run

    run()


@shared_task(ignore_result=True)
def pull_points_expire() -> None:
    """Destroy pull points unused for HPWSN_PULLPOINT_IDLE_S."""
    from subscriptions.services import pull_points_expire as run

    run()


@shared_task(ignore_result=True)
def registrations_demand_sync() -> None:
    """Subscribe to, pause or resume demand-based publishers as subscribers come and go."""
    from subscriptions.registrations import registrations_demand_sync as run

    run()


@shared_task(ignore_result=True)
def registration_release(publisher_address: str, subscription_addresses: list[str]) -> None:
    """Unsubscribe from the publisher of a destroyed demand registration (its row is gone, so
    the task carries the addresses)."""
    from subscriptions.registrations import registration_release as run

    run(publisher_address=publisher_address, subscription_addresses=subscription_addresses)
