"""The reliable log's writes: what group commit may put together in one transaction."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from unittest import mock

import pytest

from dispatch.models import StoredMessage
from dispatch.reliable import messages_store
from tests.support import on_embedded_database

pytestmark = pytest.mark.django_db


def _message(nid: str, key: str | None) -> StoredMessage:
    return StoredMessage(
        notification_id=nid,
        topic_path="ALL",
        payload=b"<m/>",
        accepted_at=time.time(),
        idempotency_key=key,
    )


def test_a_repeated_key_within_one_batch_is_stored_once_under_the_first_id():
    # A publisher's retry grouped into the same commit as its original, beside another request.
    ids = messages_store(
        messages=[_message("a1", None), _message("b1", "pub|m-1#0"), _message("c1", "pub|m-1#0")]
    )

    assert ids == ["a1", "b1", "b1"]
    stored = StoredMessage.objects.order_by("seq").values_list("notification_id", flat=True)
    assert list(stored) == ["a1", "b1"]


def test_a_key_already_in_the_log_answers_with_the_id_it_was_first_accepted_under():
    messages_store(messages=[_message("first", "pub|m-2#0")])

    assert messages_store(messages=[_message("again", "pub|m-2#0")]) == ["first"]
    assert StoredMessage.objects.filter(idempotency_key="pub|m-2#0").count() == 1


def test_a_commit_of_more_keys_than_one_query_takes_finds_every_one_already_in_the_log():
    """Group commit may put together more keys than one statement's parameters allow: they are
    looked up in slices, and a key of the last slice is found as surely as one of the first."""
    messages_store(messages=[_message(f"old{i}", f"pub|k-{i}#0") for i in (0, 700, 1199)])
    batch = [_message(f"new{i}", f"pub|k-{i}#0") for i in range(1200)]

    ids = messages_store(messages=batch)

    assert [ids[0], ids[700], ids[1199]] == ["old0", "old700", "old1199"]
    assert ids[1:700] == [f"new{i}" for i in range(1, 700)]
    assert StoredMessage.objects.filter(idempotency_key__startswith="pub|k-").count() == 1200


def test_an_ended_loops_writer_goes_with_it():
    # An ended loop's id can pass to a new loop (it is an address). A writer the loop left
    # "running", its drain cut off by the loop's end, would never drain a new loop's requests: it
    # must not be the new loop's writer.
    import asyncio
    import gc

    from dispatch import reliable

    async def writer():
        return reliable.log_writer()

    loop = asyncio.new_event_loop()
    left = loop.run_until_complete(writer())
    assert loop.run_until_complete(writer()) is left  # one writer a loop
    left.running = True  # as when the loop ended during a commit
    loop.close()
    del loop
    gc.collect()
    assert all(w is not left for w in reliable._writers.values())
    fresh = asyncio.run(writer())
    assert fresh is not left
    assert not fresh.running


def _commits_of_their_own() -> None:
    """What the log's own transactions promise, on a connection in autocommit as the log's thread
    has it (BEGIN and COMMIT sent by hand, or one query, not Django's atomic): a commit that fails
    stores none of its messages and leaves the connection fit for the next; on SQLite, a key
    another writer stored between the read and the insert is answered with that writer's id."""
    from django.db import IntegrityError, connection

    from dispatch import reliable

    assert not connection.in_atomic_block
    assert messages_store(messages=[_message("k1", "pub|t#0")]) == ["k1"]

    refused = _message("bad", None)
    refused.priority = -1  # the column's check refuses it
    with pytest.raises(IntegrityError):
        messages_store(messages=[_message("b1", "pub|t#1"), refused])

    if connection.vendor == "postgresql":
        return  # one query under the lock, its insert skipping the keys it finds: no such race
    real = reliable._ids_by_key
    reads: list[list[str]] = []

    def unseen_at_first_read(cursor, keys):  # the other writer's row came after the first read
        reads.append(keys)
        return {} if len(reads) == 1 else real(cursor, keys)

    with mock.patch.object(reliable, "_ids_by_key", unseen_at_first_read):
        ids = messages_store(messages=[_message("again", "pub|t#0"), _message("c1", None)])
    assert ids == ["k1", "c1"]
    assert len(reads) == 2  # the insert met the key, and the commit ran again
    stored = StoredMessage.objects.order_by("seq").values_list("notification_id", flat=True)
    assert list(stored) == ["k1", "c1"]
    assert not connection.in_atomic_block


def _holds_the_write_lock_from_its_begin() -> None:
    """On SQLite the commit's BEGIN is the settings' IMMEDIATE: the write lock is the commit's from
    its start, so its insert never finds another writer in its way after its read."""
    import sqlite3

    from django.db import connection

    from dispatch import reliable

    real = reliable._ids_by_key
    others: list[str] = []

    def read_then_try_another_writer(cursor, keys):
        other = sqlite3.connect(connection.settings_dict["NAME"], timeout=0)
        try:
            other.execute("BEGIN IMMEDIATE")
            others.append("began")
            other.execute("ROLLBACK")
        except sqlite3.OperationalError as exc:
            others.append(str(exc))
        finally:
            other.close()
        return real(cursor, keys)

    with mock.patch.object(reliable, "_ids_by_key", read_then_try_another_writer):
        assert messages_store(messages=[_message("w1", "pub|w#0")]) == ["w1"]
    assert others == ["database is locked"]


@pytest.mark.django_db(transaction=True)
def test_a_commit_of_its_own_on_the_test_database():  # PostgreSQL under make test
    _commits_of_their_own()


def _queries_sent(monkeypatch) -> list[str]:
    """The statements the log's writes send to the server, one entry a query."""
    from dispatch import reliable

    sent: list[str] = []
    real = reliable._cursor

    class Recording:
        def __init__(self, cursor):
            self.cursor = cursor

        def execute(self, sql, params=None):
            sent.append(sql)
            return self.cursor.execute(sql, params)

        def __getattr__(self, name):
            return getattr(self.cursor, name)

    @contextmanager
    def recording():
        with real() as cursor:
            yield Recording(cursor)

    monkeypatch.setattr(reliable, "_cursor", recording)
    return sent


@pytest.mark.django_db(transaction=True)
def test_a_group_commit_on_postgresql_is_one_query(monkeypatch):
    """The lock, the read of the keys and the insert go to the server together, as one
    transaction, and still answer a repeated key with its first id."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("SQLite's statements are calls into the library, not round trips")
    messages_store(messages=[_message("first", "pub|q-1#0")])
    sent = _queries_sent(monkeypatch)

    ids = messages_store(
        messages=[_message("again", "pub|q-1#0"), _message("new", "pub|q-2#0"), _message("n", None)]
    )

    assert ids == ["first", "new", "n"]
    assert len(sent) == 1
    assert sent[0].startswith("SELECT pg_advisory_xact_lock(")
    stored = StoredMessage.objects.order_by("seq").values_list("notification_id", flat=True)
    assert list(stored) == ["first", "new", "n"]
    assert not connection.in_atomic_block


@pytest.mark.django_db(transaction=True)
def test_concurrent_commits_become_visible_in_sequence_order():
    """A reader of the log that has seen row n never sees a row below n appear later: the fan-out
    takes a row it has skipped for one rolled back. Four writers commit at once, on connections
    in autocommit as the log's thread has it, while a reader reads what is new."""
    from django.db import connections

    writers, commits = 4, 150
    expected = writers * sum(1 + i % 3 for i in range(commits))
    done = threading.Event()
    late: list[tuple[int, int]] = []
    seen: set[int] = set()
    errors: list[BaseException] = []

    def write(w: int) -> None:
        try:
            for i in range(commits):
                batch = [_message(f"w{w}-{i}-{j}", f"pub|o-{w}-{i}#{j}") for j in range(1 + i % 3)]
                messages_store(messages=batch)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    def read() -> None:
        try:
            highest, deadline = 0, time.monotonic() + 60
            while (not done.is_set() or len(seen) < expected) and time.monotonic() < deadline:
                fresh = set(StoredMessage.objects.values_list("seq", flat=True)) - seen
                late.extend((seq, highest) for seq in fresh if seq < highest)
                seen.update(fresh)
                highest = max(seen, default=0)
        finally:
            connections.close_all()

    reader = threading.Thread(target=read)
    reader.start()
    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    reader.join()

    assert errors == []
    assert len(seen) == expected
    assert late == []


def test_a_commit_of_its_own_on_the_embedded_database(tmp_path):
    """The same on SQLite (the default), whose BEGIN takes the mode of the settings."""
    done = on_embedded_database(
        tmp_path,
        "from tests.dispatch.test_reliable_log import _commits_of_their_own\n"
        "from tests.dispatch.test_reliable_log import _holds_the_write_lock_from_its_begin\n"
        "_commits_of_their_own(); _holds_the_write_lock_from_its_begin(); print('held')\n",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "held"


@pytest.mark.django_db(transaction=True)
def test_a_key_published_through_several_writers_at_once_is_stored_once_under_one_id():
    """A publisher that retries through another web process while the first still commits: four
    writers commit the same 100 keys at once, in the same order. Each key is stored once, and
    every writer answers it with the id it was stored under."""
    from django.db import connections

    writers, keys = 4, [f"pub|race-{i}#0" for i in range(100)]
    answers: list[dict[str, str]] = [{} for _ in range(writers)]
    errors: list[BaseException] = []
    start = threading.Barrier(writers)

    def write(w: int) -> None:
        try:
            start.wait(10)
            for first in range(0, len(keys), 2):
                batch = [_message(f"w{w}-{k}", k) for k in keys[first : first + 2]]
                ids = messages_store(messages=batch)
                answers[w].update(zip(keys[first : first + 2], ids, strict=True))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    assert errors == []
    stored = dict(
        StoredMessage.objects.filter(idempotency_key__in=keys).values_list(
            "idempotency_key", "notification_id"
        )
    )
    assert len(stored) == len(keys)  # each key once (the column is unique: a second would fail)
    assert all(answer == stored for answer in answers)
