"""Django's requests run their synchronous work on a fixed set of threads."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from asgiref.sync import sync_to_async

from hpwsn_site.requestthreads import RequestThreads


def _app(seen: list[str], running: list[int]) -> Any:
    """An ASGI app whose request does its synchronous work where Django would."""

    def work() -> None:
        running[0] += 1
        running[1] = max(running[1], running[0])
        time.sleep(0.02)
        seen.append(threading.current_thread().name)
        running[0] -= 1

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await sync_to_async(work)()

    return app


def _request(path: str) -> dict[str, Any]:
    return {"type": "http", "path": path}


def test_requests_share_the_threads_and_wait_for_a_free_one():
    seen: list[str] = []
    running = [0, 0]
    threads = RequestThreads(_app(seen, running), size=2)

    async def burst() -> None:
        await asyncio.gather(*(threads(_request("/api/v1/topics"), None, None) for _ in range(8)))

    asyncio.run(burst())
    asyncio.run(burst())  # another loop, the same threads

    assert len(seen) == 16
    assert {name.rsplit("_", 1)[0] for name in seen} <= {"hpwsn-request-0", "hpwsn-request-1"}
    assert running[1] <= 2  # never more requests at once than threads


def test_a_light_load_keeps_to_the_thread_given_back_last():
    """One request at a time uses one thread (and so one database connection), not each in turn."""
    seen: list[str] = []
    threads = RequestThreads(_app(seen, [0, 0]), size=4)

    async def one_by_one() -> None:
        for _ in range(6):
            await threads(_request("/console/"), None, None)

    asyncio.run(one_by_one())
    assert len(set(seen)) == 1


def test_health_probes_do_not_wait_for_a_request_thread():
    seen: list[str] = []
    threads = RequestThreads(_app(seen, [0, 0]), size=1)
    asyncio.run(threads(_request("/healthz"), None, None))
    assert not seen[0].startswith("hpwsn-request")
