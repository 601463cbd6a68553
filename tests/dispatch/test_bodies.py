"""Message bodies leave Redis once every queue that took them has let them go (memory follows
the backlog, not the traffic), and never before: in process, against a real Redis."""

from __future__ import annotations

import time

import pytest

from dispatch import reliable
from dispatch.fanout import fanout_run, queues_bound
from dispatch.models import StoredMessage
from dispatch.pump import Pump
from dispatch.push import Outcome
from dispatch.services import STATS
from hpwsn_site import state
from tests.dispatch.test_checkpoint import _at, _subscription


@pytest.fixture
def world(db, own_redis, settings):  # type: ignore[no-untyped-def]
    settings.HPWSN_FANOUT_TICK_S = 0
    settings.HPWSN_CONSUMER_WINDOW = 0
    settings.HPWSN_DEDUP_WINDOW_S = 0
    _at(own_redis, 0)
    return own_redis


def _publish(n: int, topic: str = "ALL") -> list[str]:
    now = state.shared_now()
    ids = [f"b{i}-{now}" for i in range(n)]
    reliable.messages_store(
        messages=[
            StoredMessage(
                notification_id=nid, topic_path=topic, payload=b"<wsnt:Message/>", accepted_at=now
            )
            for nid in ids
        ]
    )
    fanout_run(linger=0, max_run=60)
    return ids


def _drain(sid: str) -> list[str]:
    got: list[str] = []

    def push(_entry, batch):  # type: ignore[no-untyped-def]
        got.extend(nid for nid, _p in batch.live)
        return Outcome(ok=True, status=200)

    Pump(sid, push=push, keep_alive=False).run()
    return got


def _bodies(r, ids: list[str]) -> int:  # type: ignore[no-untyped-def]
    return int(r.exists(*(state.payload_key(i) for i in ids)))


def test_a_body_stays_until_the_last_subscription_has_it_then_goes(world):
    r = world
    a, b = _subscription(), _subscription()
    time.sleep(0.01)  # accepted after both subscriptions exist
    ids = _publish(3)

    assert _drain(a) == ids
    assert _bodies(r, ids) == 3  # b has not had them yet

    assert _drain(b) == ids
    assert _bodies(r, ids) == 0
    assert r.keys(f"{state.PREFIX}refs:*") == []


def test_a_message_nobody_matched_keeps_no_body(world):
    _subscription()
    time.sleep(0.01)
    ids = _publish(2, topic="ELSEWHERE")

    assert _bodies(world, ids) == 0


def test_unsubscribing_gives_back_what_its_queue_held(world):
    r = world
    a, b = _subscription(), _subscription()
    time.sleep(0.01)
    ids = _publish(2)
    pipe = r.pipeline(transaction=False)
    state.subscription_forget(pipe, a)
    pipe.execute()
    assert _bodies(r, ids) == 2  # b still needs them

    pipe = r.pipeline(transaction=False)
    state.subscription_forget(pipe, b)
    pipe.execute()

    assert _bodies(r, ids) == 0


def test_messages_dropped_by_a_queue_bound_give_back_their_bodies(world, settings):
    r = world
    sid = _subscription()
    time.sleep(0.01)
    ids = _publish(5)
    settings.HPWSN_QUEUE_MAX_DEPTH = 2

    queues_bound(r, {state.queue_key(sid): 5})

    assert _drain(sid) == ids[-2:]
    assert _bodies(r, ids) == 0


def test_a_body_without_a_count_is_left_to_its_time_to_live(world):
    """A body queued before bodies were counted (or whose count expired) is never deleted by a
    take: another queue may still hold it."""
    r = world
    sid = _subscription()
    r.set(state.payload_key("old"), b"<wsnt:Message/>", ex=60)
    r.rpush(state.queue_key(sid), b"old|f0")
    r.sadd(state.BUSY, sid)

    assert _drain(sid) == ["old"]
    assert r.exists(state.payload_key("old")) == 1
    assert r.exists(f"{state.PREFIX}refs:old") == 0


def test_messages_past_their_time_to_live_are_skipped_wherever_they_are_in_the_batch(world):
    r = world
    sid = _subscription()
    r.set(state.payload_key("live"), b"<wsnt:Message/>", ex=60)
    r.rpush(state.queue_key(sid), b"gone1|f0", b"live|f0", b"gone2|f0")  # gone: no body
    r.sadd(state.BUSY, sid)
    expired = int(r.hget(STATS, "expired") or 0)

    assert _drain(sid) == ["live"]
    assert int(r.hget(STATS, "expired") or 0) - expired == 2
    assert r.exists(*state.queue_keys(sid)) == 0
