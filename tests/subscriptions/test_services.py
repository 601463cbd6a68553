"""Subscribe and Renew as the services answer them: duplicates, termination times, states."""

from __future__ import annotations

import time

import pytest

from hpwsn.wsn import TopicRef
from subscriptions import services as subs
from subscriptions.models import Subscription
from topics import services as topics
from topics.acl import Principal

ADMIN = Principal(name="admin1", groups=frozenset({"hpwsn-admins"}))
CONSUMER = "http://127.0.0.1:9/duplicates"  # nothing listens: these tests push nothing


def _subscribe(termination: str | None) -> tuple[Subscription, bool]:
    return subs.subscription_create(
        consumer_address=CONSUMER,
        topic=TopicRef(text="Plant:Hall", dialect=None, nsmap={}),
        content=None,
        initial_termination_time=termination,
        soap_version="1.1",
        use_raw=False,
        base_url="http://testserver",
        principal=ADMIN,
    )


def _stored(sub: Subscription) -> Subscription:
    return Subscription.objects.get(id=sub.id)


@pytest.mark.django_db(transaction=True)
def test_a_duplicate_subscribe_may_extend_the_termination_time_but_never_shorten_it() -> None:
    topics.topic_create(path="Plant:Hall")
    first, created = _subscribe("PT2H")
    assert created
    until = _stored(first).termination_time
    assert until is not None

    shorter, created = _subscribe("PT1H")

    assert (shorter.id, created) == (first.id, False)
    assert _stored(first).termination_time == until

    longer, created = _subscribe("PT3H")

    assert (longer.id, created) == (first.id, False)
    extended = _stored(first).termination_time
    assert extended is not None
    assert extended > until

    # No InitialTerminationTime asks for no end: the longest lifetime there is.
    unbounded, _created = _subscribe(None)
    assert unbounded.id == first.id
    assert _stored(first).termination_time is None
    bounded_again, _created = _subscribe("PT1H")
    assert bounded_again.id == first.id
    assert _stored(first).termination_time is None
    assert Subscription.objects.filter(consumer_address=CONSUMER).count() == 1


@pytest.mark.django_db(transaction=True)
def test_renew_resumes_a_suspended_subscription_and_leaves_a_paused_one_paused() -> None:
    topics.topic_create(path="Plant:Hall")
    sub, _created = _subscribe(None)

    subs.subscription_set_state(subscription_id=str(sub.id), paused=True, principal=ADMIN)
    subs.subscription_renew(subscription_id=str(sub.id), termination_time="PT1H", principal=ADMIN)

    paused = _stored(sub)
    assert paused.state == Subscription.State.PAUSED
    assert paused.termination_time is not None

    subs.subscription_set_state(subscription_id=str(sub.id), paused=False, principal=ADMIN)
    assert subs.subscription_suspend(subscription_id=str(sub.id))
    assert _stored(sub).state == Subscription.State.SUSPENDED
    subs.subscription_renew(subscription_id=str(sub.id), termination_time="PT2H", principal=ADMIN)

    assert _stored(sub).state == Subscription.State.ACTIVE


@pytest.mark.django_db(transaction=True)
def test_resume_keeps_an_active_subscriptions_attempts_and_starts_a_suspended_one_afresh() -> None:
    # A Resume once wiped the attempts of any subscription: its owner could resume a dead
    # consumer every few seconds and its batches never reached the dead-letter store, nor the
    # subscription suspension, while its queue grew.
    from hpwsn_site import state

    topics.topic_create(path="Plant:Hall")
    sub, _created = _subscribe(None)
    sid = str(sub.id)
    r = state.get_redis()
    due = time.time() + 3600

    attempts = [b'{"at": 1700000000.0, "status": 503}', b'{"at": 1700000001.0, "status": 503}']

    def backed_off() -> None:
        r.delete(state.attempts_key(sid))
        r.rpush(state.attempts_key(sid), *attempts)
        r.set(state.failing_since_key(sid), "1700000000.0")
        r.zadd(state.RETRY, {sid: due})

    backed_off()
    subs.subscription_set_state(subscription_id=sid, paused=False, principal=ADMIN)
    assert r.lrange(state.attempts_key(sid), 0, -1) == attempts
    assert r.get(state.failing_since_key(sid)) == b"1700000000.0"
    assert r.zscore(state.RETRY, sid) is None  # retried now: a sign of life

    subs.subscription_set_state(subscription_id=sid, paused=True, principal=ADMIN)
    backed_off()
    subs.subscription_set_state(subscription_id=sid, paused=False, principal=ADMIN)
    assert r.lrange(state.attempts_key(sid), 0, -1) == attempts

    assert subs.subscription_suspend(subscription_id=sid)
    backed_off()
    subs.subscription_set_state(subscription_id=sid, paused=False, principal=ADMIN)
    assert _stored(sub).state == Subscription.State.ACTIVE
    assert not r.exists(state.attempts_key(sid), state.failing_since_key(sid))
