"""What a SOAP handler receives and returns; shared by the WSN and legacy edges."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import sqlite3
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import psycopg
from django.conf import settings
from django.db import OperationalError, close_old_connections, connections
from lxml import etree

from hpwsn.soap import Request
from hpwsn_site.dblane import lock_timeout_here
from hpwsn_site.requestthreads import FreeQueues
from topics.acl import ANONYMOUS, Principal

T = TypeVar("T")
log = logging.getLogger(__name__)


def publish_key(principal: Principal, key: str | None, *, client: str) -> str | None:
    """The idempotency key of a publication (SOAP and REST): per principal, and an anonymous
    caller's per client address (hpwsn_site.clients), so that one caller's key cannot suppress
    another's messages. Kept whole, however long: the accept hashes a long one."""
    return f"{principal.publisher(client)}|{key}" if key else None


@dataclass(slots=True)
class Call:
    req: Request
    body: etree._Element  # the operation element (inside WsnProcess for legacy calls)
    base_url: str  # scheme://host[:port] under which /wsn/ is reached
    resource_id: str | None  # subscription or pull point id, from the URL, wsa:To or a header
    principal: Principal = ANONYMOUS  # who is calling (hpwsn_site.auth)
    idempotency_key: str | None = None  # the Idempotency-Key header, else None
    resource_kind: str | None = None  # "subscriptions" or "pullpoints" when the URL names one
    client: str = ""  # the caller's address (hpwsn_site.clients.client_address)

    @property
    def publish_key(self) -> str | None:
        """What makes a repeated Notify recognisable: Idempotency-Key, else wsa:MessageID."""
        return publish_key(
            self.principal, self.idempotency_key or self.req.message_id, client=self.client
        )

    def resource_from_to(self, kind: str) -> str | None:
        """The id of a `kind` resource addressed by URL path, wsa:To, or reference parameter."""
        if self.resource_id:
            return self.resource_id
        if self.req.to:
            parts = urlsplit(self.req.to).path.rstrip("/").split("/")
            if len(parts) >= 2 and parts[-2] == kind:
                return parts[-1]
        key = "SubscriptionId" if kind == "subscriptions" else "PullPointId"
        return self.req.reference_params.get(key)


@dataclass(slots=True)
class Reply:
    action: str
    body: bytes | str


Handler = Callable[[Call], Awaitable[Reply | None]]


async def db(fn: Callable[..., T], /, **kwargs: Any) -> T:
    """Run a database-touching service from async code, as a request would: on one of the
    process's SOAP threads (`DbThreads`), between the connection checks a request gets.

    SOAP calls bypass Django's request cycle (hpwsn_site.fastpath), so the connection hygiene
    that request_started/request_finished provide is done here.
    """
    return await _soap_threads().run(fn, **kwargs)


class ResourceBusy(Exception):
    """A call's database work waited `HPWSN_DB_LOCK_TIMEOUT_S` for a lock (rows another
    transaction holds, an operator's edit) and gave up: its transaction was rolled back, nothing
    changed, and the caller may try again."""


def _lock_timed_out(exc: OperationalError) -> bool:
    """PostgreSQL's lock_timeout, or SQLite's busy timeout ("database is locked")."""
    cause = exc.__cause__
    if isinstance(cause, sqlite3.OperationalError):
        return getattr(cause, "sqlite_errorname", "") == "SQLITE_BUSY"
    return isinstance(cause, psycopg.errors.LockNotAvailable)


def _busy(exc: OperationalError) -> ResourceBusy:
    busy = ResourceBusy("the resource is held by another transaction; try again later")
    busy.__cause__ = exc
    return busy


class DbThread:
    """A thread of its own for one stream of database work from async code (the reliable log's
    group commits, the health checks), which keeps its connection as `db` keeps the shared
    thread's: closed when older than CONN_MAX_AGE or broken.

    Handing it work is a queue put and a wake-up of the caller's loop; `sync_to_async` costs several
    times that (the executor, the context copy), once per group commit on the publishing path.
    """

    def __init__(self, name: str, *, lock_timeout_s: float | None = None) -> None:
        self.name = name
        self.lock_timeout_s = lock_timeout_s  # its connection's wait for a lock (None: the default)
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._pid = 0
        self._lock = threading.Lock()
        _db_threads.append(self)

    def run(self, fn: Callable[..., T], /, **kwargs: Any) -> asyncio.Future[T]:
        """`fn(**kwargs)` on the thread, between the connection checks a request gets."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def job() -> None:
            try:
                close_old_connections()
                result = fn(**kwargs)
            except OperationalError as exc:
                _settle(loop, future, None, _busy(exc) if _lock_timed_out(exc) else exc)
            except BaseException as exc:  # handed to the caller, whatever it is
                _settle(loop, future, None, exc)
            else:
                _settle(loop, future, result, None)
            finally:
                close_old_connections()

        self._put(job)
        return future

    def close(self) -> None:
        """Close the thread's connection and wait for it (a test database is about to be
        dropped)."""
        if self._pid != os.getpid():
            return
        done = threading.Event()

        def job() -> None:
            try:
                connections.close_all()
            finally:
                done.set()

        self._jobs.put(job)
        done.wait(30)

    def _put(self, job: Callable[[], None]) -> None:
        if self._pid != os.getpid():  # first use, or a child process forked from one that ran it
            with self._lock:
                if self._pid != os.getpid():
                    self._jobs = queue.SimpleQueue()
                    threading.Thread(
                        target=_serve,
                        args=(self._jobs, self.lock_timeout_s),
                        name=self.name,
                        daemon=True,
                    ).start()
                    self._pid = os.getpid()
        self._jobs.put(job)


_db_threads: list[DbThread] = []


def db_threads_close() -> None:
    """Close the kept connection of every DbThread of this process (a test database is about to
    be dropped)."""
    for thread in _db_threads:
        thread.close()


class DbThreads:
    """A few DbThreads for the requests' database work (SOAP's operations on subscriptions, pull
    points and publisher registrations, a REST publisher's token check): a call takes a free
    thread and gives it back when its job ends, so a slow one (a row that another transaction
    holds, a burst of Renews) holds up its own thread, not every call of the process. Each
    thread keeps its connection, whose statements wait at most `lock_timeout_s` for a lock
    (PostgreSQL's rows, SQLite's write lock): a call that waits longer fails with ResourceBusy,
    so that calls held by locks another transaction holds cannot take every thread for as long
    as it holds them. A call that finds every thread busy waits for one; the thread given back
    last is taken first (FreeQueues), so a light load keeps using (and connecting) only a few.

    A thread goes back to the free ones when its job ends, not when a caller that gave up stops
    waiting: the job still runs there, and a call given that thread would wait behind it.
    """

    def __init__(self, name: str, size: int, *, lock_timeout_s: float | None = None) -> None:
        self.threads = [DbThread(f"{name}-{i}", lock_timeout_s=lock_timeout_s) for i in range(size)]
        self._free = FreeQueues(self.threads)

    async def run(self, fn: Callable[..., T], /, **kwargs: Any) -> T:
        free = self._free.queue()
        thread = await free.get()
        job = thread.run(fn, **kwargs)

        def ended(job: asyncio.Future[T]) -> None:
            free.put_nowait(thread)
            if not job.cancelled():
                job.exception()  # read, so that a job nobody waits for any more logs nothing

        job.add_done_callback(ended)
        return await asyncio.shield(job)  # a caller that gives up leaves the job running


_soap_pool: DbThreads | None = None


def _soap_threads() -> DbThreads:
    """The process's SOAP threads, `HPWSN_WEB_SOAP_THREADS` of them, made at the first call."""
    global _soap_pool
    if _soap_pool is None:
        _soap_pool = DbThreads(
            "hpwsn-soap",
            max(1, settings.HPWSN_WEB_SOAP_THREADS),
            lock_timeout_s=settings.HPWSN_DB_LOCK_TIMEOUT_S,
        )
    return _soap_pool


def _serve(jobs: queue.SimpleQueue[Callable[[], None]], lock_timeout_s: float | None) -> None:
    if lock_timeout_s:
        lock_timeout_here(lock_timeout_s)
    while True:
        try:
            jobs.get()()
        except Exception:  # the connection's tidying failed after the answer; the thread goes on
            log.exception("database thread job failed")


def _settle(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    result: Any,
    exc: BaseException | None,
) -> None:
    def settle() -> None:
        if future.done():  # the caller gave up (cancelled)
            return
        if exc is None:
            future.set_result(result)
        else:
            future.set_exception(exc)

    with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody waits
        loop.call_soon_threadsafe(settle)
