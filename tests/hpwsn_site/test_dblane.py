"""DbLane: the database work of many threads on the connections of a few."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import OperationalError, connection, transaction

from dispatch.models import DeadLetter
from hpwsn_site.dblane import DbLane, on_db
from subscriptions.models import Subscription
from tests.support import wait_until


def _name() -> str:
    return threading.current_thread().name


def test_work_from_a_client_thread_runs_on_the_lane_and_its_errors_reach_the_caller():
    lane = DbLane("hpwsn-test-lane", 1)

    def fails() -> None:
        raise ValueError("no such row")

    def client() -> tuple[str, str]:
        lane.serve_from_here()
        with pytest.raises(ValueError, match="no such row"):
            on_db(fails)
        return on_db(_name), _name()

    with ThreadPoolExecutor(1, thread_name_prefix="hpwsn-test-client") as pool:
        assert pool.submit(client).result() == ("hpwsn-test-lane-0", "hpwsn-test-client_0")
    # Any other thread runs its work itself.
    assert on_db(_name) == threading.current_thread().name
    lane.shutdown(timeout=5)
    assert not any(t.is_alive() for t in lane.threads)


@pytest.mark.django_db(transaction=True)
def test_a_client_thread_that_connects_itself_is_logged(caplog):
    """Database work a pump thread does without `on_db` would keep a connection per thread again:
    the connection it opens is logged, with where it was opened."""
    lane = DbLane("hpwsn-test-lane-bypassed", 1)

    def lane_records() -> list[logging.LogRecord]:  # not another test's threads' records
        return [r for r in caplog.records if r.name == "hpwsn_site.dblane"]

    def client() -> None:
        lane.serve_from_here()
        try:
            on_db(Subscription.objects.count)  # through the lane: nothing logged
            assert not lane_records()
            Subscription.objects.count()  # on the client's own connection
        finally:
            connection.close()

    with (
        caplog.at_level("WARNING", logger="hpwsn_site.dblane"),
        ThreadPoolExecutor(1, thread_name_prefix="hpwsn-test-bypass") as pool,
    ):
        pool.submit(client).result()
    lane.shutdown(timeout=5)
    assert [r.getMessage() for r in lane_records()] == [
        "hpwsn-test-bypass_0 opened a database connection of its own: its database work should"
        " go through on_db"
    ]


@pytest.mark.django_db(transaction=True)
def test_sixteen_threads_reach_the_database_on_the_lanes_two_connections():
    """What a pool process's pump threads do when pushes fail for good together: each one's
    database work (here a read and a write) goes through the lane."""
    if connection.vendor != "postgresql":
        pytest.skip("names the PostgreSQL server process of each connection")
    lane = DbLane("hpwsn-test-lane-two", 2)
    start = threading.Barrier(16)

    def backend_and_count() -> tuple[int, int]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = int(cursor.fetchone()[0])
        return pid, Subscription.objects.count()

    def client() -> set[int]:
        start.wait(10)
        return {on_db(backend_and_count)[0] for _ in range(20)}

    with ThreadPoolExecutor(
        16, thread_name_prefix="hpwsn-test-pump", initializer=lane.serve_from_here
    ) as pool:
        backends = set().union(*pool.map(lambda _: client(), range(16)))
    assert 1 <= len(backends) <= 2, backends
    lane.shutdown(timeout=5)  # the lane's threads close their connections as they end

    def still_connected() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [list(backends)]
            )
            return int(cursor.fetchone()[0])

    assert wait_until(lambda: still_connected() == 0, timeout=5)


@pytest.mark.django_db(transaction=True)
def test_jobs_held_by_a_lock_give_up_after_the_lanes_timeout_and_the_work_after_them_is_done():
    """An operator's transaction holds a row that both of a lane's threads must write (two
    pumps' suspensions, say): they fail after the lane's lock timeout instead of holding up
    every pump's database work for as long as the transaction lasts, and the read sent after
    them is answered while the row is still held."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's lock_timeout")
    letter = DeadLetter.objects.create(
        subscription_id="s", consumer_address="http://c/", notification_id="n", message=b"m",
        reason=DeadLetter.Reason.PERMANENT,
    )  # fmt: skip
    lane = DbLane("hpwsn-test-lane-locked", 2, lock_timeout_s=0.5)

    def write() -> int:
        return DeadLetter.objects.filter(pk=letter.pk).update(reason=DeadLetter.Reason.EXHAUSTED)

    def read() -> str:
        return DeadLetter.objects.get(pk=letter.pk).reason

    with ThreadPoolExecutor(3, initializer=lane.serve_from_here) as clients:
        with transaction.atomic():
            DeadLetter.objects.select_for_update().get(pk=letter.pk)  # held until the block ends
            writes = [clients.submit(on_db, write) for _ in range(2)]
            time.sleep(0.1)  # both threads of the lane wait for the row
            answered = clients.submit(on_db, read).result(timeout=30)
            for held in writes:
                with pytest.raises(OperationalError, match="lock timeout"):
                    held.result(timeout=30)
        assert answered == DeadLetter.Reason.PERMANENT
        # The row released, the same threads write it: their connections survived the failures.
        assert clients.submit(on_db, write).result(timeout=30) == 1
    lane.shutdown(timeout=5)
