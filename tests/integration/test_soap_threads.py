"""A SOAP call held up in the database holds up only itself.

SOAP's operations on subscriptions and pull points reach the database on a few threads of the web
process (hpwsn_site/soapcall.py, `HPWSN_WEB_SOAP_THREADS`). Here a Renew waits for a row another
transaction holds (an operator's edit, a long maintenance statement); meanwhile other callers
subscribe, renew and poll, and get their answers before the row is released. On one thread for
every call, as these operations ran before, each of them waited for the held Renew.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from subscriptions.models import Subscription
from tests.integration.test_owners import OPERATIONS, call, subscribe

# The fixtures of the ownership tests: a topic anyone may use, a demo user's credentials.
from tests.integration.test_owners import as_user as as_user
from tests.integration.test_owners import topic as topic
from tests.support import wait_or_fail

pytestmark = pytest.mark.integration


@contextmanager
def _rows_held(django_db_blocker, ids: list[str]) -> Iterator[threading.Event]:  # type: ignore[no-untyped-def]
    """These subscriptions' rows locked by another transaction (an operator's edit) until the
    yielded event is set, or the block ends."""
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                list(Subscription.objects.select_for_update().filter(id__in=ids))
                locked.set()
                release.wait(120)
        finally:
            connection.close()

    with django_db_blocker.unblock():
        holder = threading.Thread(target=hold)
        holder.start()
        try:
            assert locked.wait(30)
            yield release
        finally:
            release.set()
            holder.join(60)


def _renews_waiting_for_a_lock(committed) -> int:  # type: ignore[no-untyped-def]
    def waiting() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE 'UPDATE%%subscriptions_subscription%%'"
            )
            return int(cursor.fetchone()[0])

    return int(committed(waiting))


def test_a_renew_held_by_a_locked_row_holds_up_no_other_call(
    platform, topic, consumer_factory, as_user, committed, django_db_blocker
):
    if connection.vendor != "postgresql":
        pytest.skip("holds a PostgreSQL row lock")
    consumer = consumer_factory()
    # Each subscription its own consumer address (the same consumer and filter twice are one).
    held = subscribe(platform, consumer.url + "/held", **as_user("subscriber1"))
    other = subscribe(platform, consumer.url + "/other", **as_user("subscriber1"))
    assert held != other
    held_id = held.rstrip("/").rsplit("/", 1)[-1]
    with _rows_held(django_db_blocker, [held_id]) as release, ThreadPoolExecutor(1) as pool:
        renew = pool.submit(call, platform, OPERATIONS["Renew"], to=held, **as_user("subscriber1"))
        wait_or_fail(
            lambda: _renews_waiting_for_a_lock(committed) > 0,
            timeout=30,
            what="the Renew waiting for the held row",
        )
        # Meanwhile: a new subscription, a Renew of another one, a pull point polled.
        subscribe(platform, consumer.url + "/new", **as_user("subscriber1"))
        res = call(platform, OPERATIONS["Renew"], to=other, **as_user("subscriber1"))
        assert res.status == 200, res.body
        res = call(platform, "<wsnt:CreatePullPoint/>", **as_user("subscriber1"))
        assert res.status == 200, res.body
        pull_point = res.findtext(".//wsnt:PullPoint/wsa:Address")
        assert pull_point
        res = call(platform, "<wsnt:GetMessages/>", to=pull_point, **as_user("subscriber1"))
        assert res.status == 200, res.body
        # All answered while the row is still held: the held Renew still waits.
        assert not renew.done(), renew.result().body
        release.set()
        res = renew.result(timeout=60)
    assert res.status == 200, res.body  # released, the held Renew is answered too
    # ...and its new termination time (PT2H) is stored.
    ends = committed(lambda: Subscription.objects.get(id=held_id).termination_time)
    assert ends is not None
    assert timedelta(minutes=115) < ends - timezone.now() <= timedelta(hours=2)


def test_renews_held_by_locked_rows_give_up_and_leave_the_threads_to_other_calls(
    platform, topic, consumer_factory, as_user, committed, django_db_blocker
):
    """Every SOAP thread of the process held by a row lock: each waits at most
    HPWSN_DB_LOCK_TIMEOUT_S (5 s), answers ResourceUnavailableFault (503, Retry-After), and the
    calls behind them are answered while the rows are still held. Without the limit they waited
    as long as the rows were held."""
    if connection.vendor != "postgresql":
        pytest.skip("holds PostgreSQL row locks")
    consumer = consumer_factory()
    user = as_user("subscriber1")
    held = [subscribe(platform, f"{consumer.url}/held{i}", **user) for i in (1, 2)]
    other = subscribe(platform, consumer.url + "/other", **user)
    held_ids = [address.rstrip("/").rsplit("/", 1)[-1] for address in held]
    before = committed(
        lambda: dict(
            Subscription.objects.filter(id__in=held_ids).values_list("id", "termination_time")
        )
    )
    renew = OPERATIONS["Renew"]
    with _rows_held(django_db_blocker, held_ids), ThreadPoolExecutor(3) as pool:
        stuck = [pool.submit(call, platform, renew, to=address, **user) for address in held]
        # Both SOAP threads of the web process (HPWSN_WEB_SOAP_THREADS=2) wait.
        wait_or_fail(lambda: _renews_waiting_for_a_lock(committed) == 2, 30, "two Renews waiting")
        # Answered within the block, so while the rows are still held.
        res = pool.submit(call, platform, renew, to=other, **user).result(timeout=30)
        answers = [future.result(timeout=30) for future in stuck]
    assert res.status == 200, res.body
    for answer in answers:
        assert answer.status == 503, answer.body
        assert answer.fault_name == "ResourceUnavailableFault", answer.body
        assert answer.headers.get("retry-after") == "1"
        assert b"held by another transaction" in answer.body
    after = committed(
        lambda: dict(
            Subscription.objects.filter(id__in=held_ids).values_list("id", "termination_time")
        )
    )
    assert after == before  # the Renews that gave up changed nothing
    # Released, the same Renew goes through.
    res = call(platform, renew, to=held[0], **user)
    assert res.status == 200, res.body
