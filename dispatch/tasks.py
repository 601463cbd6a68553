from celery import shared_task
from django.conf import settings

from hpwsn_site import state

# The stages import late: they import this module to queue their tasks (an import cycle).


@shared_task(acks_late=True, ignore_result=True)
def fanout() -> None:
    """Drain accepted notifications into per-subscription queues."""
    from dispatch.fanout import fanout_run

    fanout_run()


@shared_task(acks_late=True, ignore_result=True)
def pump(subscription_id: str) -> None:
    """Drain one subscription's queue in order (one pump per subscription). The pump loops
    (dispatch/pumploop.py) do this from the ready list; the task serves pumps queued as tasks by
    an older version."""
    from dispatch.pump import pump_run

    pump_run(subscription_id=subscription_id)


@shared_task(ignore_result=True)
def retry_sweep() -> None:
    from dispatch.sweeps import retry_sweep as run

    run()


@shared_task(ignore_result=True)
def stall_sweep() -> None:
    from dispatch.sweeps import stall_sweep as run

    state.periodic_within_share("stall_sweep", settings.HPWSN_PERIODIC_SHARE, run)


@shared_task(ignore_result=True)
def fragments_expire() -> None:
    """Drop, count and log reassemblies whose fragments stopped coming (thesis 5.3.3.4)."""
    from dispatch.fragments import fragments_expire as run

    run()


@shared_task(ignore_result=True)
def reliable_checkpoint() -> None:
    """Watermarks of reliable topics to the database; prune the log; recover a lost Redis."""
    from dispatch.reliable import checkpoint_run

    state.periodic_within_share("checkpoint", settings.HPWSN_PERIODIC_SHARE, checkpoint_run)
