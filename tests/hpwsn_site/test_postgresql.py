"""The PostgreSQL backend's health check: no round trip on a live connection, a dropped one
replaced."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import close_old_connections, connection

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def kept() -> Any:
    """A thread of its own, as the web's publishing thread or a pump thread: its connection is
    kept between units of work, each started and ended with close_old_connections()."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's backend")
    thread = ThreadPoolExecutor(max_workers=1)

    def run(fn: Callable[[], Any]) -> Any:
        def unit() -> Any:
            close_old_connections()
            try:
                return fn()
            finally:
                close_old_connections()

        return thread.submit(unit).result()

    yield run
    thread.submit(lambda: connection.close()).result()
    thread.shutdown()


def _one(sql: str, *params: object) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()[0]


def test_a_live_connection_is_checked_without_a_round_trip(kept):
    pid = kept(lambda: _one("SELECT pg_backend_pid() + 0 * length('unit one')"))

    def check() -> bool:
        connection.close_if_health_check_failed()  # what the first cursor of a unit runs
        return connection.health_check_done

    assert kept(check)
    # What the server last ran for that connection: the first unit's query, not a SELECT 1.
    assert "unit one" in _one("SELECT query FROM pg_stat_activity WHERE pid = %s", pid)
    assert kept(lambda: _one("SELECT pg_backend_pid()")) == pid  # kept, not replaced


def test_a_connection_the_server_dropped_is_replaced_before_use(kept):
    pid = kept(lambda: _one("SELECT pg_backend_pid()"))
    assert _one("SELECT pg_terminate_backend(%s)", pid) is True
    time.sleep(0.2)  # the server's goodbye reaches the socket

    # No error: the dead connection is found before the query and a new one opened.
    pid_after = kept(lambda: _one("SELECT pg_backend_pid()"))
    assert pid_after != pid
