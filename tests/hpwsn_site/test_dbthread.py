"""DbThread: database work from async code on a thread of its own, which keeps its connection."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from django.db import connection

from hpwsn_site.soapcall import DbThread, DbThreads
from tests.support import on_embedded_database


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


def test_a_pool_call_held_up_holds_up_only_its_own_thread():
    pool = DbThreads("hpwsn-test-pool", 2)
    release = threading.Event()

    def name() -> str:
        return threading.current_thread().name

    def held_up() -> str:
        release.wait(30)
        return name()

    async def run() -> tuple[str, list[str]]:
        held = asyncio.ensure_future(pool.run(held_up))
        await asyncio.sleep(0.05)
        # The held job keeps its thread; calls meanwhile take the other, one after another.
        meanwhile = [await pool.run(name) for _ in range(3)]
        assert not held.done()
        release.set()
        return await held, meanwhile

    held_on, meanwhile = asyncio.run(run())
    assert held_on in {"hpwsn-test-pool-0", "hpwsn-test-pool-1"}
    assert meanwhile == [({"hpwsn-test-pool-0", "hpwsn-test-pool-1"} - {held_on}).pop()] * 3


def test_a_pool_with_every_thread_busy_makes_a_call_wait_for_one():
    pool = DbThreads("hpwsn-test-pool-one", 1)
    release = threading.Event()
    order: list[str] = []

    def job(tag: str) -> None:
        if tag == "first":
            release.wait(30)
        order.append(tag)

    async def run() -> None:
        first = asyncio.ensure_future(pool.run(job, tag="first"))
        await asyncio.sleep(0.05)
        second = asyncio.ensure_future(pool.run(job, tag="second"))
        await asyncio.sleep(0.05)
        assert not second.done()  # waiting for the one thread
        release.set()
        await asyncio.gather(first, second)

    asyncio.run(run())
    assert order == ["first", "second"]


def test_a_pool_thread_whose_caller_gave_up_is_free_again_only_when_its_job_ends():
    pool = DbThreads("hpwsn-test-pool-gave-up", 2)
    release, ended = threading.Event(), threading.Event()

    def name() -> str:
        return threading.current_thread().name

    def held_up() -> None:
        release.wait(5)
        ended.set()

    async def run() -> list[str]:
        held = asyncio.ensure_future(pool.run(held_up))
        await asyncio.sleep(0.05)
        held.cancel()  # its client went away; the job still runs on its thread
        await asyncio.sleep(0.05)
        meanwhile = [await pool.run(name) for _ in range(3)]
        assert not ended.is_set(), "a call waited for the job its caller gave up"
        release.set()
        return meanwhile

    meanwhile = asyncio.run(run())
    assert len(set(meanwhile)) == 1  # all on the thread that was free
    assert ended.wait(5)


@pytest.mark.django_db(transaction=True)
def test_a_pool_call_held_by_a_lock_past_the_pools_limit_fails_busy_and_changes_nothing():
    """A SOAP thread waits at most its pool's lock timeout (HPWSN_DB_LOCK_TIMEOUT_S) for a row
    another transaction holds: the call fails with ResourceBusy, its write is rolled back, and
    the thread serves the next call, which goes through once the row is free."""
    from django.db import connections, transaction

    from dispatch.models import DeliveryCursor
    from hpwsn_site.soapcall import ResourceBusy

    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's lock_timeout")
    DeliveryCursor.objects.create(name="held", seq=1, updated_at=0.0)
    pool = DbThreads("hpwsn-test-busy", 1, lock_timeout_s=0.3)
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                DeliveryCursor.objects.select_for_update().get(name="held")
                locked.set()
                release.wait(30)
        finally:
            connections.close_all()

    def move(*, seq: int) -> int:
        with transaction.atomic():
            DeliveryCursor.objects.create(name=f"beside-{seq}", seq=seq, updated_at=0.0)
            return DeliveryCursor.objects.filter(name="held").update(seq=seq)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(30)
        with pytest.raises(ResourceBusy, match="held by another transaction"):
            asyncio.run(pool.run(move, seq=2))
        release.set()
        holder.join(30)
        assert asyncio.run(pool.run(move, seq=3)) == 1
    finally:
        release.set()
        holder.join(30)
        for thread in pool.threads:
            thread.close()
    names = set(DeliveryCursor.objects.values_list("name", flat=True))
    assert names == {"held", "beside-3"}  # the call that gave up left nothing
    assert DeliveryCursor.objects.get(name="held").seq == 3


def test_a_rest_publishers_token_check_held_by_a_lock_is_a_503_problem(monkeypatch):
    from hpwsn_site.api import fastpublish
    from hpwsn_site.soapcall import ResourceBusy

    async def busy(fn, /, **kwargs):  # type: ignore[no-untyped-def]
        raise ResourceBusy("the resource is held by another transaction; try again later")

    monkeypatch.setattr(fastpublish, "db", busy)
    answer = asyncio.run(
        fastpublish.publish_exchange(
            topic="ALL",
            data=b'{"message": {}}',
            ctype="application/json",
            authorization="Bearer hpwsn_unknown_token",
            idempotency_key=None,
            client="127.0.0.1",
        )
    )
    assert answer.status == 503
    assert b"held by another transaction" in answer.body
    assert ("Retry-After", "1") in answer.headers


def _gives_up_on_a_held_write_lock() -> None:
    """On SQLite the limit is the connection's busy timeout: a write held by another writer's
    lock fails with ResourceBusy after the pool's limit, not the settings' 20 s; a read, and
    the connection made for it, wait for no writer."""
    import sqlite3

    from dispatch.models import DeliveryCursor
    from hpwsn_site.soapcall import ResourceBusy

    pool = DbThreads("hpwsn-test-busy", 1, lock_timeout_s=0.3)

    def write(*, name: str) -> None:
        DeliveryCursor.objects.create(name=name, seq=1, updated_at=0.0)

    other = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another writer holds the database's write lock
    try:
        # The thread's first connection is made, and reads, while the lock is held (WAL).
        assert asyncio.run(pool.run(DeliveryCursor.objects.count)) == 0
        started = time.monotonic()
        with pytest.raises(ResourceBusy):
            asyncio.run(pool.run(write, name="held"))
        waited = time.monotonic() - started
    finally:
        other.execute("ROLLBACK")
        other.close()
    asyncio.run(pool.run(write, name="free"))
    assert list(DeliveryCursor.objects.values_list("name", flat=True)) == ["free"]
    print(f"gave up after {waited:.1f} s")


def test_a_pool_call_held_by_sqlites_write_lock_fails_busy_after_the_pools_limit(tmp_path):
    done = on_embedded_database(
        tmp_path,
        "from tests.hpwsn_site.test_dbthread import _gives_up_on_a_held_write_lock\n"
        "_gives_up_on_a_held_write_lock()\n",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    waited = float(done.stdout.split()[-2])
    assert waited < 10  # the settings' busy timeout is 20 s: the pool's own limit applied
