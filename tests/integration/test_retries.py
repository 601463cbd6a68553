"""Retries, dead letters and suspension, seen from real consumers of the running platform.

The platform's env (tests/conftest.py): default schedule 0.5 s, 1 s, 2 s without jitter, throttled
minimum 1 s, suspension after 6 s of continuous failure. The retry sweep runs once a second.
"""

from __future__ import annotations

import time

import pytest
from django.core.management import call_command

from hpwsn_site import state
from tests.support import (
    ANONYMOUS_ALLOWED,
    notify_xml,
    soap_call,
    subscribe_xml,
    topic_with_policy,
    wait_until,
)

pytestmark = pytest.mark.integration


def _topic(committed, path: str, retry_schedule: str = "", **policy: object) -> None:  # type: ignore[no-untyped-def]
    # A new root refuses anonymous callers unless its policy allows them.
    committed(topic_with_policy, path, retry_schedule=retry_schedule, **ANONYMOUS_ALLOWED, **policy)


def _subscribe(platform, consumer_url: str, topic: str) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    res = soap_call(platform.endpoint, subscribe_xml(consumer_url, topic))
    assert res.status == 200, res.body
    address = res.findtext(".//wsnt:SubscriptionReference/wsa:Address")
    assert address
    return address, address.rsplit("/", 1)[1]


def _notify(platform, topic: str, *texts: str) -> None:  # type: ignore[no-untyped-def]
    messages = [(topic, f"<e:m xmlns:e='urn:t'>{t}</e:m>") for t in texts]
    res = soap_call(platform.endpoint, notify_xml(*messages))
    assert res.status == 202, res.body


def _first_letter(platform, committed, consumer, topic: str, text: str):  # type: ignore[no-untyped-def]
    """Subscribe the consumer to the topic, publish the text and wait for its one dead letter."""
    _, sub_id = _subscribe(platform, consumer.url, topic)
    _notify(platform, topic, text)
    assert wait_until(lambda: _letters(committed, sub_id), timeout=15), platform.logs()
    [letter] = _letters(committed, sub_id)
    return sub_id, letter


def _gaps(consumer) -> list[float]:  # type: ignore[no-untyped-def]
    return [b[0] - a[0] for a, b in zip(consumer.posts, consumer.posts[1:], strict=False)]


def _letters(committed, sub_id: str) -> list:  # type: ignore[no-untyped-def, type-arg]
    from dispatch.models import DeadLetter

    return committed(lambda: list(DeadLetter.objects.filter(subscription_id=sub_id)))


def test_the_gaps_between_attempts_follow_the_topics_retry_schedule(
    platform, consumer_factory, committed
):
    _topic(committed, "RetrySchedule", retry_schedule="1,3")
    consumer = consumer_factory(fail_first=2, fail_status=500)
    _subscribe(platform, consumer.url, "RetrySchedule")

    _notify(platform, "RetrySchedule", "scheduled")

    assert consumer.wait_for(1, timeout=20), platform.logs()
    assert [status for _t, status in consumer.posts] == [500, 500, 200]
    gaps = _gaps(consumer)
    # The broker's default (0.5 s, 1 s) would retry sooner: these are the topic's 1 s and 3 s.
    assert gaps[0] >= 1.0
    assert gaps[1] >= 3.0
    assert gaps[1] < 3.0 + 2.5  # due after 3 s, swept within a second


def test_a_consumers_retry_after_is_honoured(platform, consumer_factory):
    consumer = consumer_factory(fail_first=1, fail_status=503, retry_after="2")
    _subscribe(platform, consumer.url, "ALL:ALARM:ALARM2")

    _notify(platform, "ALL:ALARM:ALARM2", "after")

    assert consumer.wait_for(1, timeout=20), platform.logs()
    assert [status for _t, status in consumer.posts] == [503, 200]
    # The schedule (0.5 s) and the throttled minimum (1 s) alone would retry sooner.
    assert _gaps(consumer)[0] >= 2.0


def test_a_throttling_consumer_waits_at_least_the_throttled_minimum(
    platform, consumer_factory, committed
):
    _topic(committed, "RetryThrottled", retry_schedule="0")
    consumer = consumer_factory(fail_first=1, fail_status=429)
    _subscribe(platform, consumer.url, "RetryThrottled")

    _notify(platform, "RetryThrottled", "throttled")

    assert consumer.wait_for(1, timeout=20), platform.logs()
    assert [status for _t, status in consumer.posts] == [429, 200]
    assert _gaps(consumer)[0] >= 1.0  # the schedule says retry at once


def test_a_400_is_permanent_and_the_batch_becomes_a_dead_letter_with_its_attempt(
    platform, consumer_factory, committed
):
    consumer = consumer_factory(fail_first=1, fail_status=400, fail_body=b"bad request: " * 40)
    _, sub_id = _subscribe(platform, consumer.url, "Object:Tool")
    r = platform.redis()
    dead_before = int(r.hget("hpwsn:stats", "dead") or 0)

    _notify(platform, "Object:Tool", "rejected")
    assert wait_until(lambda: _letters(committed, sub_id), timeout=15), platform.logs()
    _notify(platform, "Object:Tool", "accepted")

    assert consumer.wait_for(1)
    time.sleep(1.5)  # a retry of the rejected batch would have come by now
    assert consumer.payload_texts() == ["accepted"]
    assert [status for _t, status in consumer.posts] == [400, 200]
    [letter] = _letters(committed, sub_id)
    assert letter.reason == "permanent"
    assert letter.consumer_address == consumer.url
    assert letter.topic == "Object:Tool"
    assert b"rejected" in bytes(letter.message)
    [attempt] = letter.attempts
    assert attempt["status"] == 400
    assert attempt["detail"] == ("bad request: " * 40)[:200]
    assert attempt["duration_ms"] >= 0
    # Other tests' failing consumers may add to the broker-wide counter meanwhile.
    assert int(r.hget("hpwsn:stats", "dead") or 0) >= dead_before + 1
    assert r.llen(state.attempts_key(sub_id)) == 0


def test_a_batch_that_exhausts_the_schedule_becomes_a_dead_letter_with_every_attempt(
    platform, consumer_factory, committed
):
    _topic(committed, "RetryExhausted", retry_schedule="0.2,0.2")
    consumer = consumer_factory(fail_first=10**6, fail_status=500, fail_body=b"down")
    _, sub_id = _subscribe(platform, consumer.url, "RetryExhausted")

    _notify(platform, "RetryExhausted", "never")

    assert wait_until(lambda: _letters(committed, sub_id), timeout=15), platform.logs()
    [letter] = _letters(committed, sub_id)
    assert letter.reason == "exhausted"
    assert [(a["status"], a["detail"]) for a in letter.attempts] == [(500, "down")] * 3
    times = [a["time"] for a in letter.attempts]
    assert times == sorted(times)
    time.sleep(1.5)
    assert len(consumer.posts) == 3  # 1 + two scheduled retries, then no more
    r = platform.redis()
    assert r.llen(state.queue_key(sub_id)) == 0
    assert r.zscore(state.RETRY, sub_id) is None


def test_redrive_delivers_a_dead_letter_to_the_healed_consumer_once(
    platform, consumer_factory, committed
):
    from io import StringIO

    consumer = consumer_factory(fail_first=1, fail_status=404)
    _, sub_id = _subscribe(platform, consumer.url, "ALL:ALARM:ALARM1:ALARM11")
    _notify(platform, "ALL:ALARM:ALARM1:ALARM11", "second chance")
    assert wait_until(lambda: _letters(committed, sub_id), timeout=15), platform.logs()
    assert consumer.received == []

    outputs = []
    for _ in range(2):
        out = StringIO()
        committed(call_command, "deadletters", "redrive", "--subscription", sub_id, stdout=out)
        outputs.append(out.getvalue())

    assert outputs[0].startswith("redriven: 1")
    assert outputs[1].startswith("redriven: 0")
    assert consumer.wait_for(1), platform.logs()
    time.sleep(1.0)
    assert consumer.payload_texts() == ["second chance"]  # once, though redriven twice
    assert wait_until(lambda: _letters(committed, sub_id) == [], timeout=5)


def test_a_letter_that_dies_again_comes_back_as_a_new_letter_with_its_new_attempts(
    platform, consumer_factory, committed
):
    from dispatch.deadletters import dead_letters_redrive

    _topic(committed, "RedriveAgain")
    consumer = consumer_factory(fail_first=2, fail_status=422)
    sub_id, first = _first_letter(platform, committed, consumer, "RedriveAgain", "third time lucky")

    assert committed(dead_letters_redrive, subscription_id=sub_id) == 1
    assert wait_until(
        lambda: [d.id for d in _letters(committed, sub_id)] not in ([], [first.id]), timeout=15
    ), platform.logs()
    [second] = _letters(committed, sub_id)
    assert second.notification_id == first.notification_id
    assert second.redriven_at is None  # a new letter, ready for another redrive
    assert [a["status"] for a in second.attempts] == [422]

    assert committed(dead_letters_redrive, ids=[second.id]) == 1
    assert consumer.wait_for(1), platform.logs()
    assert consumer.payload_texts() == ["third time lucky"]
    assert wait_until(lambda: _letters(committed, sub_id) == [], timeout=5)


def test_a_redriven_letter_lost_with_redis_is_queued_again_and_delivered(
    platform, consumer_factory, committed
):
    """A redriven letter lives in Redis until pushed; its row stays until then, and the recovery
    after a Redis loss queues it again (dispatch.reliable.recover calls letters_requeue)."""
    from dispatch.deadletters import dead_letters_redrive, letters_requeue
    from subscriptions.services import subscription_set_state, subscription_suspend

    _topic(committed, "RedriveLost")
    consumer = consumer_factory(fail_first=1, fail_status=422)
    sub_id, letter = _first_letter(platform, committed, consumer, "RedriveLost", "survives")
    # Suspended, so the redriven letter waits in the queue for the loss below.
    assert committed(subscription_suspend, subscription_id=sub_id)
    assert committed(dead_letters_redrive, subscription_id=sub_id) == 1
    r = state.get_redis()
    assert r.lrange(state.queue_key(sub_id), 0, -1) == [letter.queue_item]

    # What a Redis loss takes from this subscription: its queue and the message.
    r.delete(*state.queue_keys(sub_id), state.payload_key(letter.notification_id))
    assert [d.redriven_at is not None for d in _letters(committed, sub_id)] == [True]
    assert committed(letters_requeue, r) >= 1
    assert r.lrange(state.queue_key(sub_id), 0, -1) == [letter.queue_item]

    committed(subscription_set_state, subscription_id=sub_id, paused=False)
    assert consumer.wait_for(1), platform.logs()
    assert consumer.payload_texts() == ["survives"]
    assert wait_until(lambda: _letters(committed, sub_id) == [], timeout=5)


def test_on_an_unordered_topic_a_failed_message_waits_aside_and_the_ones_behind_go_on(
    platform, consumer_factory, committed
):
    _topic(committed, "Unordered", retry_schedule="2", ordered=False)
    consumer = consumer_factory(fail_first=1, fail_status=500)
    _subscribe(platform, consumer.url, "Unordered")

    # Its own batch: pushed (and failed) before the others are published.
    _notify(platform, "Unordered", "first")
    assert wait_until(lambda: consumer.posts, timeout=10), platform.logs()
    _notify(platform, "Unordered", "second")
    _notify(platform, "Unordered", "third")

    assert consumer.wait_for(3, timeout=20), platform.logs()
    # The first failed once and waited its 2 s aside while the others were delivered.
    assert consumer.payload_texts() == ["second", "third", "first"]
    assert consumer.posts[0][1] == 500
    assert consumer.posts[-1][0] - consumer.posts[0][0] >= 2.0


def test_an_unordered_message_that_keeps_failing_becomes_a_dead_letter_alone(
    platform, consumer_factory, committed
):
    _topic(committed, "UnorderedPoison", retry_schedule="0.5,0.5", ordered=False)
    consumer = consumer_factory(fail_containing=b"poison", fail_status=500)
    _, sub_id = _subscribe(platform, consumer.url, "UnorderedPoison")

    _notify(platform, "UnorderedPoison", "poison")
    assert wait_until(lambda: consumer.posts, timeout=10), platform.logs()
    _notify(platform, "UnorderedPoison", "fine-1")
    _notify(platform, "UnorderedPoison", "fine-2")

    assert consumer.wait_for(2), platform.logs()
    assert consumer.payload_texts() == ["fine-1", "fine-2"]
    assert wait_until(lambda: _letters(committed, sub_id), timeout=15), platform.logs()
    [letter] = _letters(committed, sub_id)
    assert b"poison" in bytes(letter.message)
    assert letter.reason == "exhausted"
    assert [a["status"] for a in letter.attempts] == [500, 500, 500]
    assert state.get_redis().zcard(state.aside_key(sub_id)) == 0


def test_an_unordered_consumer_that_fails_three_batches_in_a_row_is_left_alone_until_one_is_due(
    platform, consumer_factory, committed
):
    from dispatch.deliver import UNORDERED_FAILURES_IN_A_ROW
    from dispatch.services import consumer_limit_set
    from subscriptions.services import subscription_set_state

    _topic(committed, "UnorderedDown", retry_schedule="30", ordered=False)
    consumer = consumer_factory(fail_first=1000, fail_status=500)
    # A window of one message: every message is its own batch.
    committed(consumer_limit_set, consumer=consumer.url, window=1, rate=None)
    address, sub_id = _subscribe(platform, consumer.url, "UnorderedDown")
    try:
        committed(subscription_set_state, subscription_id=sub_id, paused=True)
        _notify(platform, "UnorderedDown", *(f"m{i}" for i in range(5)))
        r = state.get_redis()
        assert wait_until(lambda: r.llen(state.queue_key(sub_id)) == 5, timeout=10)
        started = time.time()

        committed(subscription_set_state, subscription_id=sub_id, paused=False)

        assert wait_until(lambda: len(consumer.posts) >= UNORDERED_FAILURES_IN_A_ROW, 10)
        time.sleep(1.5)
        assert len(consumer.posts) == UNORDERED_FAILURES_IN_A_ROW
        assert r.zcard(state.aside_key(sub_id)) == UNORDERED_FAILURES_IN_A_ROW
        assert r.llen(state.queue_key(sub_id)) == 5 - UNORDERED_FAILURES_IN_A_ROW
        # Back off until the first batch set aside is due, 30 s after its failure.
        assert r.zscore(state.RETRY, sub_id) >= started + 29
    finally:
        soap_call(address, "<wsnt:Unsubscribe/>", to=address)
        committed(consumer_limit_set, consumer=consumer.url, window=None, rate=None)


def test_letters_of_a_subscription_that_is_gone_stay_in_the_store(
    platform, consumer_factory, committed
):
    from dispatch.deadletters import dead_letters_redrive

    consumer = consumer_factory(fail_first=1, fail_status=410)
    address, sub_id = _subscribe(platform, consumer.url, "ALL:ALARM:ALARM1")
    _notify(platform, "ALL:ALARM:ALARM1", "orphan")
    assert wait_until(lambda: _letters(committed, sub_id), timeout=15), platform.logs()
    assert soap_call(address, "<wsnt:Unsubscribe/>", to=address).status == 200

    assert committed(dead_letters_redrive, subscription_id=sub_id) == 0
    assert len(_letters(committed, sub_id)) == 1


def test_a_consumer_failing_for_the_configured_time_is_suspended_and_resumed_in_order(
    platform, consumer_factory, committed
):
    from subscriptions.models import Subscription

    _topic(committed, "RetrySuspend", retry_schedule=",".join(["1"] * 20))
    consumer = consumer_factory(fail_first=10**6, fail_status=500)
    address, sub_id = _subscribe(platform, consumer.url, "RetrySuspend")

    def sub_state() -> str:
        return committed(lambda: Subscription.objects.get(id=sub_id).state)  # type: ignore[no-any-return]

    _notify(platform, "RetrySuspend", "m1")
    assert wait_until(lambda: sub_state() == "suspended", timeout=20), platform.logs()
    first, last = consumer.posts[0][0], consumer.posts[-1][0]
    assert last - first >= 6.0  # failing for HPWSN_SUSPEND_AFTER_S before it was suspended

    attempts = len(consumer.posts)
    _notify(platform, "RetrySuspend", "m2", "m3")
    r = platform.redis()
    assert wait_until(lambda: r.llen(state.queue_key(sub_id)) == 3)  # the queue keeps filling
    time.sleep(3.0)
    assert len(consumer.posts) == attempts  # no attempt reaches the consumer
    assert r.zscore(state.RETRY, sub_id) is None

    with consumer.lock:
        consumer.fail_first = 0  # the consumer is healthy again
    res = soap_call(address, "<wsnt:ResumeSubscription/>", to=address)
    assert res.status == 200, res.body

    assert consumer.wait_for(3), platform.logs()
    assert consumer.payload_texts() == ["m1", "m2", "m3"]
    assert sub_state() == "active"
    assert _letters(committed, sub_id) == []


def test_renew_resumes_a_suspended_subscription(platform, consumer_factory, committed):
    from subscriptions.services import subscription_suspend

    consumer = consumer_factory()
    address, sub_id = _subscribe(platform, consumer.url, "Object:Food:Fruit")
    committed(subscription_suspend, subscription_id=sub_id)
    _notify(platform, "Object:Food:Fruit", "held")
    time.sleep(1.5)
    assert consumer.received == []

    res = soap_call(
        address,
        "<wsnt:Renew><wsnt:TerminationTime>PT1H</wsnt:TerminationTime></wsnt:Renew>",
        to=address,
    )
    assert res.status == 200, res.body

    assert consumer.wait_for(1), platform.logs()
    assert consumer.payload_texts() == ["held"]


def test_a_queue_beyond_its_depth_limit_drops_its_oldest_messages(settings):
    import redis

    from dispatch.fanout import queues_bound

    settings.HPWSN_QUEUE_MAX_DEPTH = 2
    r = redis.Redis.from_url(settings.REDIS_URL)
    key = state.queue_key("depth-test")
    r.delete(key)
    r.rpush(key, b"1", b"2", b"3", b"4")
    dropped_before = int(r.hget("hpwsn:stats", "dropped") or 0)

    queues_bound(r, {key: 4})

    assert r.lrange(key, 0, -1) == [b"3", b"4"]
    assert int(r.hget("hpwsn:stats", "dropped") or 0) == dropped_before + 2
    r.delete(key)


@pytest.fixture
def operator_client(committed):  # type: ignore[no-untyped-def]
    """A logged-in admin whose requests run on a committed connection (the workers see them)."""
    import uuid

    from django.contrib.auth.models import User
    from django.test import Client

    name = f"op-{uuid.uuid4().hex[:8]}"
    user = committed(User.objects.create_superuser, name, f"{name}@example.org", "pw")
    client = Client()
    # On the committed connection too: the session and last_login must not be held by (and lock
    # rows in) the test's own transaction.
    committed(client.force_login, user)

    def post(url: str, data: dict[str, object]):  # type: ignore[no-untyped-def]
        return committed(client.post, url, data)

    def get(url: str):  # type: ignore[no-untyped-def]
        return committed(client.get, url)

    yield post, get
    committed(lambda: User.objects.filter(username=name).delete())


def test_an_operator_redrives_a_dead_letter_from_the_admin(
    platform, consumer_factory, committed, operator_client
):
    post, get = operator_client
    consumer = consumer_factory(fail_first=1, fail_status=422)
    _, sub_id = _subscribe(platform, consumer.url, "ALL:ALARM:ALARM1:ALARM12")
    _notify(platform, "ALL:ALARM:ALARM1:ALARM12", "from the admin")
    assert wait_until(lambda: _letters(committed, sub_id), timeout=15), platform.logs()
    [letter] = _letters(committed, sub_id)

    page = get(f"/admin/dispatch/deadletter/?q={sub_id}")
    assert page.status_code == 200
    assert letter.notification_id in page.content.decode()
    res = post(
        "/admin/dispatch/deadletter/",
        {"action": "redrive", "_selected_action": [str(letter.id)]},
    )

    assert res.status_code == 302
    assert consumer.wait_for(1), platform.logs()
    assert consumer.payload_texts() == ["from the admin"]
    assert wait_until(lambda: _letters(committed, sub_id) == [], timeout=5)


def test_an_operator_resumes_a_suspended_subscription_from_the_admin(
    platform, consumer_factory, committed, operator_client
):
    from subscriptions.services import subscription_suspend

    post, get = operator_client
    consumer = consumer_factory()
    _, sub_id = _subscribe(platform, consumer.url, "Object:Food:Fruit:Grape")
    committed(subscription_suspend, subscription_id=sub_id)
    _notify(platform, "Object:Food:Fruit:Grape", "resumed by an operator")
    time.sleep(1.5)
    assert consumer.received == []

    page = get("/admin/subscriptions/subscription/?state__exact=suspended")
    assert page.status_code == 200
    assert sub_id in page.content.decode()
    res = post(
        "/admin/subscriptions/subscription/",
        {"action": "resume", "_selected_action": [sub_id]},
    )

    assert res.status_code == 302
    assert consumer.wait_for(1), platform.logs()
    assert consumer.payload_texts() == ["resumed by an operator"]
