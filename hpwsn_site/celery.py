import os
from typing import Any

from celery import Celery, signals

from hpwsn_site import brokerqos

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hpwsn_site.settings")

brokerqos.install()
app = Celery("hpwsn")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


# The node registry (monitoring): the worker's main process and beat heartbeat; pool processes
# count under their worker. Imports are late: this module loads before Django is set up
# (hpwsn_site/__init__.py imports it), the handlers run after.
@signals.worker_ready.connect(dispatch_uid="hpwsn-node-worker")
def _worker_ready(sender: Any = None, **_kwargs: Any) -> None:
    from monitoring.heartbeat import node_start

    controller = getattr(sender, "controller", None)
    node_start(
        role="worker",
        name=str(getattr(sender, "hostname", "") or ""),
        pool=getattr(controller, "concurrency", None),
    )
    _legacy_marks_drop()


def _legacy_marks_drop() -> None:
    """What a Redis upgraded from an earlier version keeps and nothing reads any more."""
    import logging

    from redis.exceptions import RedisError

    from hpwsn_site import state

    try:
        gone = state.legacy_marks_drop(state.get_redis())
    except RedisError:  # Redis away at start: the next worker start tries again
        logging.getLogger(__name__).warning("old scheduled marks not dropped", exc_info=True)
        return
    if gone:
        logging.getLogger(__name__).info("dropped %d scheduled marks of an earlier version", gone)


@signals.beat_init.connect(dispatch_uid="hpwsn-node-beat")
def _beat_init(**_kwargs: Any) -> None:
    from monitoring.heartbeat import node_start

    node_start(role="beat")


@signals.worker_shutdown.connect(dispatch_uid="hpwsn-node-worker-stop")
def _worker_shutdown(**_kwargs: Any) -> None:
    from monitoring.heartbeat import node_stop

    node_stop()


# A task keeps its process's database connections, as a request does: closed when older than
# CONN_MAX_AGE or broken (CELERY_DB_REUSE_MAX in settings.py keeps Celery from closing them all).
@signals.task_prerun.connect(dispatch_uid="hpwsn-db-before-task")
@signals.task_postrun.connect(dispatch_uid="hpwsn-db-after-task")
def _connections_tidy(**_kwargs: Any) -> None:
    from django.db import close_old_connections

    close_old_connections()


# Each pool process pushes from the ready list with its own pump loop (dispatch/pumploop.py).
@signals.worker_process_init.connect(dispatch_uid="hpwsn-pump-loop")
def _worker_process_init(**_kwargs: Any) -> None:
    from dispatch.pumploop import pump_loop_start

    pump_loop_start()


@signals.worker_process_shutdown.connect(dispatch_uid="hpwsn-counters-flush")
def _worker_process_shutdown(**_kwargs: Any) -> None:
    # A pool process leaves with os._exit (no atexit): let its pushes in flight end, then write
    # its last counts.
    from dispatch.pumploop import pump_loop_stop
    from monitoring import counters, events

    pump_loop_stop(timeout=5.0)
    counters.flush()
    events.flush()
