"""Django's HTTP requests on a fixed set of threads, each keeping its database connection.

Under ASGI, Django runs each request's synchronous work (views, middleware, the ORM) on a thread
made for that request, so every page or REST call opened a database connection of its own and
closed it at the end: on PostgreSQL a server process started and stopped per request, and a burst
of concurrent requests opened as many connections at once. A burst of 150 API reads against a
server allowing 100 connections got 54 to 70 answers of 500 ("too many clients").

Here a request takes one of `HPWSN_WEB_REQUEST_THREADS` threads for its synchronous work (asgiref's
`ThreadSensitiveContext` with an executor of our own) and gives it back at the end. The threads
live as long as the process, so their connections are kept (CONN_MAX_AGE, checked before each
request as a request's are); a request that finds every thread busy waits for one. The thread
given back last is taken first, so a light load keeps using (and connecting) only a few. `/healthz`
stays outside: a load balancer's probe must not queue behind a burst (its checks run on a thread
of their own, monitoring/selectors.py).
"""

from __future__ import annotations

import asyncio
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from asgiref.sync import ThreadSensitiveContext
from django.conf import settings
from django.db import connections

ASGIApp = Any

_OUTSIDE = ("/healthz",)


R = TypeVar("R")


class FreeQueues(Generic[R]):
    """The free ones of a fixed set of resources (threads), as a LIFO queue per event loop: the
    one given back last is taken first, so a light load keeps using only a few.

    Kept by the loop itself, weakly, as the other tables kept by a loop (dispatch/reliable.py):
    an ended loop's queue goes with it, and is never taken for a new loop at the same address.
    A process serves from one loop; tests run many."""

    def __init__(self, items: list[R]) -> None:
        self.items = items
        self._free: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.LifoQueue[R]] = (
            weakref.WeakKeyDictionary()
        )

    def queue(self) -> asyncio.LifoQueue[R]:
        """The free ones, as seen from the running loop."""
        loop = asyncio.get_running_loop()
        free = self._free.get(loop)
        if free is None:
            free = self._free[loop] = asyncio.LifoQueue()
            for item in self.items:
                free.put_nowait(item)
        return free


class RequestThreads:
    def __init__(self, app: ASGIApp, size: int) -> None:
        self.app = app
        self.executors = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"hpwsn-request-{i}")
            for i in range(size)
        ]
        self._free = FreeQueues(self.executors)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in _OUTSIDE:
            return await self.app(scope, receive, send)
        free = self._free.queue()
        executor = await free.get()
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.app(scope, receive, send)
        finally:
            free.put_nowait(executor)


_made: list[RequestThreads] = []


def request_threads(app: ASGIApp) -> RequestThreads:
    threads = RequestThreads(app, settings.HPWSN_WEB_REQUEST_THREADS)
    _made.append(threads)
    return threads


def request_connections_close() -> None:
    """Close the request threads' kept connections (a test database is about to be dropped)."""
    for threads in _made:
        for executor in threads.executors:
            executor.submit(connections.close_all).result()
