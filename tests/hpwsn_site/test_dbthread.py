"""DbThread: database work from async code on a thread of its own, which keeps its connection."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from django.db import connection

from hpwsn_site.soapcall import DbThread


def test_answers_and_errors_reach_the_caller_from_the_named_thread():
    thread = DbThread("hpwsn-test-db")

    def where(*, add: int) -> tuple[str, int]:
        return threading.current_thread().name, add + 1

    def fails() -> None:
        raise ValueError("no such row")

    async def run() -> None:
        assert await thread.run(where, add=1) == ("hpwsn-test-db", 2)
        with pytest.raises(ValueError, match="no such row"):
            await thread.run(fails)
        # In order: each job after the one before.
        assert await asyncio.gather(*(thread.run(where, add=i) for i in range(5))) == [
            ("hpwsn-test-db", i + 1) for i in range(5)
        ]

    asyncio.run(run())


def test_a_caller_that_gave_up_or_whose_loop_closed_does_not_stop_the_thread():
    thread = DbThread("hpwsn-test-db")
    release = threading.Event()

    async def cancelled() -> None:
        job = asyncio.ensure_future(thread.run(release.wait, timeout=5))
        await asyncio.sleep(0)
        job.cancel()

    asyncio.run(cancelled())  # the loop closes while the job still runs
    release.set()
    time.sleep(0.2)  # the job ends, and its answer finds the loop closed

    async def after() -> str:
        return await thread.run(lambda: "still serving")

    assert asyncio.run(after()) == "still serving"


@pytest.mark.django_db(transaction=True)
def test_the_thread_keeps_its_connection_until_closed():
    if connection.vendor != "postgresql":
        pytest.skip("reads PostgreSQL's backend pid")
    thread = DbThread("hpwsn-test-db")

    def pid() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            return int(cursor.fetchone()[0])

    async def two() -> list[int]:
        return [await thread.run(pid), await thread.run(pid)]

    first, second = asyncio.run(two())
    assert first == second  # one connection for both jobs, not one each
    thread.close()
    assert asyncio.run(two())[0] != first
    thread.close()
