"""The database work of many threads on the connections of a few.

Django keeps a connection per thread. A worker pool process pushes from `HPWSN_PUMP_THREADS`
threads (16, dispatch/pumploop.py), and each of them that reached the database once (a batch
dead-lettered, a suspension, the change log read for a subscription's change) kept a connection
of its own: 17 a pool process, 34 for a worker of two, so that a few workers filled PostgreSQL's
100. Most of a pump's work is Redis and HTTP; its database work is rare and short.

A thread marked as a lane's client (`DbLane.serve_from_here`) sends its database work to the
lane's threads instead (`on_db`): `HPWSN_PUMP_DB_THREADS` of them a pool process, each keeping its
connection, checked before each job as a request's is. Any other thread (a Celery task, a test,
the lane's own threads) runs the work itself.

Rule that keeps it free of deadlocks: a client never holds a lock while it waits for the lane.
The per-process caches take their lock inside the work they send (topics/changes.py,
hpwsn_site/state.py), so a lock is held only by threads that never wait for the lane.

A job held up in the database holds up its lane thread, and the clients' work queues behind it
when every thread is held: the pumps of a process would wait for an operator's transaction that
holds the rows of two subscriptions being suspended. So a lane's statements wait at most
`HPWSN_DB_LOCK_TIMEOUT_S` (5 s) for a lock (PostgreSQL's rows and tables, SQLite's write lock),
and then fail as they would on a database error: the pump's batch stays queued and is pushed
again later, nothing is lost.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from django.db import close_old_connections, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created
from django.dispatch import receiver

T = TypeVar("T")
_Job = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]

log = logging.getLogger(__name__)

_here = threading.local()


class DbLane:
    """A few threads, each keeping its database connection, that run the work sent to them in
    the order it came."""

    def __init__(self, name: str, size: int, *, lock_timeout_s: float = 5.0) -> None:
        self.lock_timeout_s = lock_timeout_s
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.threads = [
            threading.Thread(target=self._serve, name=f"{name}-{i}", daemon=True)
            for i in range(max(1, size))
        ]
        for thread in self.threads:
            thread.start()

    def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` on one of the lane's threads; its result or its exception."""
        future: Future[T] = Future()
        self.jobs.put((future, fn, args, kwargs))
        return future.result()

    def serve_from_here(self) -> None:
        """Send the calling thread's `on_db` work to this lane (a thread pool's initializer)."""
        _here.lane = self

    def shutdown(self, timeout: float | None = 0.0) -> None:
        """The jobs sent so far done, the threads end and close their connections; waits for
        that up to `timeout` seconds (None: for good)."""
        for _ in self.threads:
            self.jobs.put(None)
        if timeout != 0.0:
            for thread in self.threads:
                thread.join(timeout)

    def _serve(self) -> None:
        lock_timeout_here(self.lock_timeout_s)
        while (job := self.jobs.get()) is not None:
            future, fn, args, kwargs = job
            try:
                close_old_connections()  # too old, or broken by the last job: replaced first
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # the caller's to handle, as if it had run there
                future.set_exception(exc)
        connections.close_all()


def lock_timeout_here(seconds: float) -> None:
    """The database connections the calling thread opens from now on wait at most `seconds` for
    a lock (a thread shared by many callers: a lane's, a SOAP thread of the web)."""
    _here.lock_timeout_s = seconds


def on_db(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)`, on the lane of the calling thread if it has one, else here."""
    lane: DbLane | None = getattr(_here, "lane", None)
    if lane is None:
        return fn(*args, **kwargs)
    return lane.call(fn, *args, **kwargs)


@receiver(connection_created)
def _connected(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """A new connection of a thread given a lock timeout (`lock_timeout_here`) waits at most that
    long for a lock: PostgreSQL's lock_timeout, SQLite's busy timeout (the settings' 20 s
    otherwise). A client thread that connects itself has database work not sent through `on_db`
    (logged)."""
    if getattr(_here, "lane", None) is not None:
        log.warning(
            "%s opened a database connection of its own: its database work should go through on_db",
            threading.current_thread().name,
            stack_info=True,
        )
    timeout = getattr(_here, "lock_timeout_s", None)
    if not timeout:
        return
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT set_config('lock_timeout', %s, false)", [f"{round(timeout * 1000)}ms"]
            )
    elif connection.vendor == "sqlite":
        connection.connection.execute(f"PRAGMA busy_timeout = {round(timeout * 1000)}")
