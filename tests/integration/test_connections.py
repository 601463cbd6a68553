"""The platform's processes keep their database connections between tasks and health probes."""

from __future__ import annotations

import time
import uuid

import httpx
import psutil
import pytest
from django.conf import settings
from django.db import connection

from dispatch.models import DeadLetter
from subscriptions.models import Subscription
from tests.support import database_sessions, notify_xml, soap_call, subscribe_xml, wait_until

pytestmark = pytest.mark.integration


def _notify(text: str) -> str:
    return notify_xml(("ALL:ALARM:ALARM1", f"<m xmlns='urn:t'>{text}</m>"))


def _delivered_once(platform, consumer_factory, text: str):  # type: ignore[no-untyped-def]
    """A consumer subscribed to the alarm topic, which has received one notification (`text`)."""
    consumer = consumer_factory()
    res = soap_call(platform.endpoint, subscribe_xml(consumer.url, "ALL:ALARM:ALARM1"))
    assert res.status == 200, res.body
    assert soap_call(platform.endpoint, _notify(text)).status == 202
    assert consumer.wait_for(1)
    return consumer


def test_the_workers_tasks_do_not_open_a_connection_each(platform, consumer_factory, db_access):
    """Celery's Django fix-up closed every connection before and after each task: the sweeps, the
    checkpoint and the snapshot that run every second, and every fan-out, each opened a new one
    (on PostgreSQL, a new server process)."""
    if connection.vendor != "postgresql":
        pytest.skip("counts the sessions PostgreSQL accepted")
    # One delivery first, so that most of the connections the processes keep are made.
    consumer = _delivered_once(platform, consumer_factory, "first")
    time.sleep(2.0)
    before = database_sessions()

    # Six seconds of the periodic tasks (three a second), with twelve fan-outs and pushes.
    for i in range(12):
        assert soap_call(platform.endpoint, _notify(str(i))).status == 202
        time.sleep(0.5)
    assert consumer.wait_for(13)
    time.sleep(1.5)  # the sessions counted by the server's statistics, a second late at most

    # What may still connect in the window: a pool process's thread at its first task or push,
    # and the connections older than CONN_MAX_AGE (60 s) replaced, five at most (the web's, and
    # two threads' in each pool process). One did here; 38 did before.
    assert database_sessions() - before <= 10


def _connections_to_the_database(pid: int) -> int:
    db = settings.DATABASES["default"]
    port = int(db.get("PORT") or 5432)
    return sum(
        1
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    )


def test_a_worker_pool_process_holds_a_few_connections_however_many_pumps_reach_the_database(
    platform, consumer_factory, db_access
):
    """Each of a pool process's sixteen pump threads that reached the database kept a connection
    of its own: a storm of dead letters over many subscriptions left 15 or more in each pool
    process, and a few workers could fill PostgreSQL's 100. Their database work goes to the
    process's `HPWSN_PUMP_DB_THREADS` (2) threads."""
    if connection.vendor != "postgresql":
        pytest.skip("counts the connections to PostgreSQL")
    # Slow consumers that refuse every push for good (400): each push is dead-lettered, and the
    # pushes to all of them are in flight, on as many pump threads, at once.
    consumers = [
        consumer_factory(fail_containing=b"doomed", fail_status=400, delay=0.3) for _ in range(24)
    ]
    for c in consumers:
        res = soap_call(platform.endpoint, subscribe_xml(c.url, "ALL:ALARM:ALARM1"))
        assert res.status == 200, res.body
    for i in range(3):
        assert soap_call(platform.endpoint, _notify(f"doomed {i}")).status == 202

    urls = [c.url for c in consumers]
    assert wait_until(
        lambda: DeadLetter.objects.filter(consumer_address__in=urls).count() == 3 * len(urls),
        timeout=60,
    ), DeadLetter.objects.filter(consumer_address__in=urls).count()

    pool = psutil.Process(platform.procs["worker"].pid).children(recursive=True)
    assert len(pool) >= 2
    # A pool process: one for its tasks, two for its pumps' database work.
    held = [_connections_to_the_database(p.pid) for p in pool]
    assert max(held) <= 3, held


def test_dead_letters_held_up_by_a_locked_table_hold_up_no_other_delivery_and_none_is_lost(
    platform, consumer_factory, db_access
):
    """The pumps' database work shares a few threads (hpwsn_site/dblane.py). A maintenance
    statement holds the dead letters' table: the pushes that consumers refuse for good cannot be
    stored, and their jobs wait on both threads of the lane. They give up after the lane's lock
    timeout, so another subscription's pushes, whose pump needs the lane to read the change log,
    go on meanwhile; and once the table is released every refused notification is stored, once."""
    if connection.vendor != "postgresql":
        pytest.skip("locks a PostgreSQL table")
    # Consumers that refuse every push for good: each of their notifications ends as a dead letter.
    doomed = [consumer_factory(fail_first=10**6, fail_status=400) for _ in range(6)]
    healthy = consumer_factory()
    addresses = []
    for c in [*doomed, healthy]:
        res = soap_call(platform.endpoint, subscribe_xml(c.url, "ALL:ALARM:ALARM2"))
        assert res.status == 200, res.body
        addresses.append(str(res.findtext(".//wsnt:SubscriptionReference/wsa:Address")))

    def alarm2(text: str) -> str:
        return notify_xml(("ALL:ALARM:ALARM2", f"<m xmlns='urn:t'>{text}</m>"))

    urls = [c.url for c in doomed]
    holder = connection.get_new_connection(connection.get_connection_params())
    try:
        holder.execute(f"LOCK TABLE {DeadLetter._meta.db_table} IN EXCLUSIVE MODE")  # till rollback
        for i in range(3):
            assert soap_call(platform.endpoint, alarm2(f"before {i}")).status == 202
        assert wait_until(lambda: all(c.posts for c in doomed), timeout=30)
        time.sleep(6.0)  # past the change log's next read (every 5 s) in every pump thread
        for i in range(3):
            assert soap_call(platform.endpoint, alarm2(f"meanwhile {i}")).status == 202
        # Received while the table is still held.
        assert wait_until(
            lambda: {"meanwhile 0", "meanwhile 1", "meanwhile 2"} <= set(healthy.payload_texts()),
            timeout=20,
        ), healthy.payload_texts()
        assert not DeadLetter.objects.filter(consumer_address__in=urls).exists()
    finally:
        holder.rollback()
        holder.close()

    # Refused for longer than HPWSN_SUSPEND_AFTER_S (6 s here), the doomed subscriptions were
    # suspended, their notifications kept queued; their owner resumes them.
    suspended = Subscription.objects.filter(
        consumer_address__in=urls, state=Subscription.State.SUSPENDED
    ).values_list("id", flat=True)
    for sid in suspended:
        address = next(a for a in addresses if a.rstrip("/").endswith(str(sid)))
        res = soap_call(platform.endpoint, "<wsnt:ResumeSubscription/>", to=address)
        assert res.status == 200, res.body

    def stored() -> int:
        return DeadLetter.objects.filter(consumer_address__in=urls).count()

    # Every notification, the six each doomed subscription had queued, stored once.
    assert wait_until(lambda: stored() == 6 * len(urls), timeout=60), stored()
    time.sleep(2.0)
    letters = DeadLetter.objects.filter(consumer_address__in=urls)
    assert sorted(letters.values_list("consumer_address", flat=True)) == sorted(urls * 6)
    assert letters.values("consumer_address", "notification_id").distinct().count() == 36


def test_health_probes_share_one_connection(platform, db_access):
    """Django runs each request's database work on a thread of its own: /healthz opened a
    connection for every probe."""
    if connection.vendor != "postgresql":
        pytest.skip("counts the sessions PostgreSQL accepted")
    assert httpx.get(platform.base_url + "/healthz", timeout=10).status_code == 200
    time.sleep(1.5)
    before = database_sessions()

    for _ in range(30):
        report = httpx.get(platform.base_url + "/healthz", timeout=10).json()
        assert report["checks"]["database"]["status"] == "ok"
    time.sleep(1.5)

    # Thirty before. What may still connect meanwhile: the connections older than CONN_MAX_AGE
    # (60 s) replaced, six at most (the web's two, two threads' in each pool process).
    assert database_sessions() - before <= 8


def test_connections_the_server_dropped_are_replaced_and_nothing_accepted_is_lost(
    platform, consumer_factory, db_access
):
    """A kept connection can break under a process (a database restart, an administrator's
    pg_terminate_backend): it is found dead before it is used and replaced, so no publish is
    refused, no pump fails, and every notification is delivered once."""
    if connection.vendor != "postgresql":
        pytest.skip("ends PostgreSQL's server processes")
    consumer = _delivered_once(platform, consumer_factory, "before")

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        ended = [pid for pid, signalled in cursor.fetchall() if signalled]
    assert len(ended) >= 2  # at least the web's and a worker's

    def gone() -> bool:  # a server process ends after it is asked to (and tells its client)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")  # read afresh within a transaction
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [ended])
            return cursor.fetchone()[0] == 0

    assert wait_until(gone, 10)

    refused = 0
    for i in range(8):
        # A publisher resends what was refused, under the same message id.
        message_id = f"urn:uuid:{uuid.uuid4()}"
        for _attempt in range(5):
            status = soap_call(platform.endpoint, _notify(f"after-{i}"), message_id=message_id)
            if status.status == 202:
                break
            refused += 1
        assert status.status == 202, status.body
    assert consumer.wait_for(9, timeout=30), consumer.payload_texts()
    time.sleep(1.0)
    texts = consumer.payload_texts()
    assert sorted(texts) == sorted(["before", *(f"after-{i}" for i in range(8))])
    assert refused == 0  # each connection checked before its first use after a pause
