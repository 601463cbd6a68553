"""DbLane: the database work of many threads on the connections of a few."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

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
