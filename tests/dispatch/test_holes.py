"""Holes found in the delivery engine by review and by probing it from outside, each closed:
every test here failed on the engine before its fix."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest

from dispatch import fragments, reliable
from dispatch.models import StoredMessage
from dispatch.pump import Pump
from dispatch.push import Outcome
from dispatch.sweeps import stall_sweep
from hpwsn_site import state
from subscriptions.models import Subscription
from tests.dispatch.test_checkpoint import _at, _cursors, _subscription

LOOPBACK = "@127.0.0.1"  # an anonymous publisher on the loopback (acl.Principal.publisher)


def _log(n: int, *, key: str | None = None, expires_at: float | None = None) -> list[int]:
    now = time.time()
    rows = [
        StoredMessage(
            notification_id=f"m{i}-{now}",
            topic_path="ALL",
            payload=b"<wsnt:Message/>",
            accepted_at=now,
            expires_at=expires_at,
            idempotency_key=f"{key}#{i}" if key else None,
        )
        for i in range(n)
    ]
    reliable.messages_store(messages=rows)
    return list(StoredMessage.objects.order_by("seq").values_list("seq", flat=True))[-n:]


def test_a_checkpoint_that_meets_a_replaced_redis_deletes_no_cursor_and_no_row(
    db, own_redis, settings, monkeypatch
):
    settings.HPWSN_DEDUP_WINDOW_S = 0
    r = own_redis
    sub = _subscription()
    _s1, s2, s3 = _log(3)
    _at(r, s3)
    r.rpush(state.queue_key(sub), f"n2|r{s2}".encode(), f"n3|r{s3}".encode())
    r.sadd(state.BUSY, sub)
    reliable.checkpoint_run()
    assert _cursors()[f"sub:{sub}"] == s2 - 1
    kept = {s2, s3}
    assert set(StoredMessage.objects.values_list("seq", flat=True)) == kept

    # The checkpoint read the position from the old Redis; its next call reaches a new, empty one.
    watermarks = reliable._watermarks

    def replaced(r, f0):  # type: ignore[no-untyped-def]
        r.flushdb()
        return watermarks(r, f0)

    monkeypatch.setattr(reliable, "_watermarks", replaced)
    reliable.checkpoint_run()

    assert _cursors()[f"sub:{sub}"] == s2 - 1
    assert set(StoredMessage.objects.values_list("seq", flat=True)) == kept


def test_a_row_whose_ttl_is_shorter_than_the_dedup_window_keeps_its_idempotency_key(
    db, own_redis, settings
):
    settings.HPWSN_DEDUP_WINDOW_S = 300
    r = own_redis
    (seq,) = _log(1, key="publisher-retry", expires_at=time.time() - 1)  # expired at once
    first = StoredMessage.objects.get(seq=seq).notification_id
    _at(r, seq)

    reliable.checkpoint_run()

    # The publisher's retry within the window is recognised, not accepted as a new message.
    again = StoredMessage(
        notification_id="retry",
        topic_path="ALL",
        payload=b"<wsnt:Message/>",
        accepted_at=time.time(),
        idempotency_key="publisher-retry#0",
    )
    assert reliable.messages_store(messages=[again]) == [first]


def test_the_log_is_read_in_batches_capped_by_bytes(db):
    now = time.time()
    big = b"<wsnt:Message>" + b"x" * 1000 + b"</wsnt:Message>"
    reliable.messages_store(
        messages=[
            StoredMessage(notification_id=f"b{i}", topic_path="ALL", payload=big, accepted_at=now)
            for i in range(10)
        ]
    )
    first = StoredMessage.objects.order_by("seq").values_list("seq", flat=True)[0] - 1

    rows = reliable.log_read(after=first, limit=10, max_bytes=2500)

    assert len(rows) == 3  # the third brings it past 2,500 bytes
    assert len(reliable.log_read(after=first, limit=10, max_bytes=1)) == 1  # one at least


def test_a_push_batch_is_capped_by_bytes(db, own_redis, settings):
    settings.HPWSN_PUSH_BATCH_BYTES = 2500
    settings.HPWSN_CONSUMER_WINDOW = 0
    r = own_redis
    sub = _subscription()
    _at(r, 0)
    for i in range(5):
        r.set(state.payload_key(f"p{i}"), b"x" * 1000)
        r.rpush(state.queue_key(sub), f"p{i}|f0".encode())
    pump = Pump(sub, keep_alive=False)
    assert pump.acquire()

    batch = pump.next_batch()

    assert batch is not None
    assert [i for i, _p in batch.live] == ["p0", "p1", "p2"]


def test_a_push_that_raises_is_a_failed_attempt_not_a_crash(db, own_redis, settings, monkeypatch):
    from dispatch import pump as pump_module

    settings.HPWSN_CONSUMER_WINDOW = 0
    r = own_redis
    sub = _subscription()
    _at(r, 0)
    r.set(state.payload_key("p0"), b"<wsnt:Message><a/></wsnt:Message>")
    r.rpush(state.queue_key(sub), b"p0|f0")

    def raises(*_args, **_kwargs):  # type: ignore[no-untyped-def]
        raise ValueError("an error nobody foresaw while building the push")

    # Before the fix such an error escaped the pump: the task crash-looped, the head stayed.
    monkeypatch.setattr(pump_module, "deliver", raises)

    assert Pump(sub, keep_alive=False).run() == 0

    attempts = [json.loads(a) for a in r.lrange(state.attempts_key(sub), 0, -1)]
    assert len(attempts) == 1
    assert "error building or sending the push" in attempts[0]["detail"]
    assert r.zscore(state.RETRY, sub) is not None  # retried on the schedule, then dead-lettered
    assert r.lrange(state.queue_key(sub), 0, -1) == [b"p0|f0"]


def test_a_pump_that_lost_its_lease_takes_nothing_off_the_queue(db, own_redis, settings):
    settings.HPWSN_CONSUMER_WINDOW = 0
    r = own_redis
    sub = _subscription()
    _at(r, 0)
    for i in range(6):
        r.set(state.payload_key(f"p{i}"), b"<wsnt:Message/>")
        r.rpush(state.queue_key(sub), f"p{i}|f0".encode())
    settings.HPWSN_PUSH_BATCH = 3

    def consumer(_entry, _batch):  # type: ignore[no-untyped-def]
        return Outcome(ok=True, status=200)

    slow = Pump(sub, push=consumer, keep_alive=False)
    assert slow.acquire()
    batch = slow.next_batch()
    assert batch is not None
    r.delete(state.lease_key(sub))  # its push outlived the lease
    other = Pump(sub, push=consumer, keep_alive=False)
    assert other.acquire()
    assert other.step()  # pushes p0-p2 and takes them off

    assert not slow.delivered(batch)  # the slow push ends: p3-p5 were never sent

    assert slow.lost
    assert r.lrange(state.queue_key(sub), 0, -1) == [b"p3|f0", b"p4|f0", b"p5|f0"]


def test_a_subscription_not_yet_in_a_stale_index_keeps_its_queue_and_busy_mark(db, own_redis):
    r = own_redis
    known = _subscription()  # the index is built with this one
    sub = Subscription.objects.create(
        consumer_address="http://127.0.0.1:9/new",
        topic_expression="ALL",
        topic_dialect="http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple",
        topic_path="ALL",
        dedup_key="made-a-moment-ago",
    )  # no version bump yet: every process's index is stale
    sid = str(sub.id)
    _at(r, 5)
    r.rpush(state.queue_key(sid), b"n5|r5")
    r.sadd(state.BUSY, known, sid)

    reliable.checkpoint_run()
    stall_sweep()

    assert sid.encode() in r.smembers(state.BUSY)
    assert r.lrange(state.queue_key(sid), 0, -1) == [b"n5|r5"]


def test_a_resend_completes_a_reassembly_whose_message_failed_to_be_stored(own_redis):
    from lxml import etree

    from hpwsn import wsn
    from tests.integration.test_fragmentation import (
        WSNT_DECL,
        notification_xml,
        split,
        xml_payload,
    )

    token = "store-fails"
    parts = split(xml_payload(token, 3000), token, partial=False)

    def incoming(f):  # type: ignore[no-untyped-def]
        el = etree.fromstring(notification_xml(f, decl=" " + WSNT_DECL).encode())
        return wsn.parse_notification_message(el)

    async def run() -> tuple[object, object, object]:
        for f in parts[:-1]:
            assert (
                await fragments.fragment_hold(
                    notification=incoming(f), topic_path="ALL", publisher=LOOPBACK
                )
                is None
            )
        whole = await fragments.fragment_hold(
            notification=incoming(parts[-1]), topic_path="ALL", publisher=LOOPBACK
        )
        # Storing the whole message failed: the request ends with an error, the claim goes.
        await fragments.fragments_unclaim([(LOOPBACK, "ALL", token)])
        again = await fragments.fragment_hold(
            notification=incoming(parts[-1]), topic_path="ALL", publisher=LOOPBACK
        )
        await fragments.fragments_done([(LOOPBACK, "ALL", token)])
        late = await fragments.fragment_hold(
            notification=incoming(parts[-1]), topic_path="ALL", publisher=LOOPBACK
        )
        return whole, again, late

    whole, again, late = asyncio.run(run())

    assert whole is not None
    assert again is not None  # the publisher's resend is stored, not answered as "late"
    assert late is None  # once stored, a late fragment is ignored


@pytest.fixture(autouse=True)
def _no_window(settings):  # type: ignore[no-untyped-def]
    settings.HPWSN_CONSUMER_WINDOW = 0


def test_messages_leave_a_pull_point_only_once_their_reply_exists(db, own_redis):
    from subscriptions.services import pull_point_create, pull_point_get_messages

    r = own_redis
    pp = pull_point_create(base_url="http://127.0.0.1:8000")
    key = state.pullpoint_key(str(pp.id))
    for i in range(3):
        r.set(state.payload_key(f"q{i}"), f"<wsnt:Message><n>{i}</n></wsnt:Message>".encode())
        r.rpush(key, f"q{i}|{uuid.uuid4()}|f0".encode())

    def fails(_items):  # type: ignore[no-untyped-def]
        raise RuntimeError("the reply could not be built")

    with pytest.raises(RuntimeError):
        pull_point_get_messages(pull_point_id=str(pp.id), maximum=None, render=fails)
    assert r.llen(key) == 3  # nothing was taken

    got = pull_point_get_messages(pull_point_id=str(pp.id), maximum=2, render=len)

    assert got == 2
    assert r.llen(key) == 1
