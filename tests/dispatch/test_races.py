"""The pump racing the subscription services: a Pause, Unsubscribe or Resume answered while a
batch is in flight, driven in process with a scripted consumer that makes the call during its
push, so the interleaving happens every time."""

from __future__ import annotations

import pytest

from dispatch.pump import Batch, Pump
from dispatch.push import Outcome
from hpwsn_site import state
from subscriptions import services as subs
from subscriptions.selectors import SubEntry, subscription_index
from tests.support import subscription_made
from topics import services as topics
from topics.acl import Principal

ADMIN = Principal(name="admin1", groups=frozenset({"hpwsn-admins"}))


def _subscription() -> str:
    topics.topic_create(path="Plant:Hall")
    sub, _created = subscription_made("http://127.0.0.1:9/races", "Plant:Hall", ADMIN)
    subscription_index()  # this process's index has it now
    return str(sub.id)


def _queue(r, sid: str, *names: str) -> None:  # type: ignore[no-untyped-def]
    for name in names:
        r.set(state.payload_key(name), f"<m>{name}</m>".encode())
        r.rpush(state.queue_key(sid), f"{name}|f0".encode())


@pytest.fixture
def one_per_push(settings):  # type: ignore[no-untyped-def]
    settings.HPWSN_PUSH_BATCH = 1
    settings.HPWSN_CONSUMER_WINDOW = 0
    settings.HPWSN_CONSUMER_RATE = 0.0


@pytest.mark.django_db(transaction=True)
def test_nothing_is_pushed_after_pause_is_answered_and_all_comes_on_resume(
    own_redis, one_per_push
) -> None:
    """PauseSubscription answered while a batch is in flight: that batch may arrive, nothing
    after it (the messages matched meanwhile wait), and Resume delivers them in order."""
    r = own_redis
    sid = _subscription()
    _queue(r, sid, "m1", "m2")
    pushed: list[tuple[str, bool]] = []  # (message, pause answered when its push began)
    paused = False

    def consumer(_entry: SubEntry, batch: Batch) -> Outcome:
        nonlocal paused
        pushed.extend((i, paused) for i, _p in batch.live)
        if not paused:
            subs.subscription_set_state(subscription_id=sid, paused=True)
            paused = True
            _queue(r, sid, "m3", "m4")  # matched while paused
        return Outcome(ok=True, status=200)

    Pump(sid, push=consumer, keep_alive=False).run()

    assert [m for m, after_pause in pushed if after_pause] == []
    assert [m for m, _a in pushed] == ["m1"]

    subs.subscription_set_state(subscription_id=sid, paused=False)
    Pump(sid, push=consumer, keep_alive=False).run()

    assert [m for m, _a in pushed] == ["m1", "m2", "m3", "m4"]


@pytest.mark.django_db(transaction=True)
def test_nothing_is_pushed_after_unsubscribe_is_answered(own_redis, one_per_push) -> None:
    """UnsubscribeResponse answered while a batch is in flight: that batch may arrive, nothing
    after it."""
    r = own_redis
    sid = _subscription()
    _queue(r, sid, "m1", "m2", "m3")
    pushed: list[tuple[str, bool]] = []
    gone = False

    def consumer(_entry: SubEntry, batch: Batch) -> Outcome:
        nonlocal gone
        pushed.extend((i, gone) for i, _p in batch.live)
        if not gone:
            subs.subscription_delete(subscription_id=sid)
            gone = True
        return Outcome(ok=True, status=200)

    Pump(sid, push=consumer, keep_alive=False).run()

    assert [m for m, after in pushed if after] == []
    assert r.llen(state.queue_key(sid)) == 0
