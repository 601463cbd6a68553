"""Delivery semantics: reliable log, priorities, flow control, idempotent publish, pull points."""

from __future__ import annotations

import time
import uuid

import pytest

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


def _topic(committed, path: str, **fields: object) -> None:  # type: ignore[no-untyped-def]
    committed(topic_with_policy, path, root=ANONYMOUS_ALLOWED, **fields)


def _logged(model, marker: str) -> list:  # type: ignore[no-untyped-def, type-arg]
    """Rows of the reliable log whose payload carries the marker."""
    return [row for row in model.objects.order_by("-seq")[:500] if marker.encode() in row.payload]


def _texts(consumer) -> list[str]:  # type: ignore[no-untyped-def]
    return consumer.payload_texts()


def _subscribe(platform, url: str, topic: str) -> str:  # type: ignore[no-untyped-def]
    res = soap_call(platform.endpoint, subscribe_xml(url, topic))
    assert res.status == 200, res.body
    return str(res.findtext(".//wsnt:SubscriptionReference/wsa:Address"))


def test_a_reliable_notification_is_in_the_database_log_before_the_publisher_is_answered(
    platform, consumer_factory, db_access
):
    from dispatch.models import StoredMessage

    consumer = consumer_factory(delay=1.0)  # slow: the row is still needed when we look
    _subscribe(platform, consumer.url, "ALL:ALARM:ALARM1:ALARM12")
    marker = uuid.uuid4().hex

    topic = "ALL:ALARM:ALARM1:ALARM12"
    res = soap_call(platform.endpoint, notify_xml((topic, f"<m xmlns='urn:t'>{marker}</m>")))

    assert res.status == 202
    assert [row.topic_path for row in _logged(StoredMessage, marker)] == [topic]
    assert consumer.wait_for(1)


def test_a_fast_topic_keeps_its_messages_out_of_the_database(
    platform, consumer_factory, committed, db_access
):
    from dispatch.models import StoredMessage

    _topic(committed, "Quick:Ticks", reliability="fast")
    consumer = consumer_factory()
    _subscribe(platform, consumer.url, "Quick:Ticks")
    marker = uuid.uuid4().hex

    body = notify_xml(("Quick:Ticks", f"<m xmlns='urn:t'>{marker}</m>"))
    res = soap_call(platform.endpoint, body)

    assert res.status == 202
    assert consumer.wait_for(1)
    assert _texts(consumer) == [marker]
    assert _logged(StoredMessage, marker) == []
    assert StoredMessage.objects.filter(topic_path="Quick:Ticks").count() == 0


@pytest.mark.parametrize("reliability", ["reliable", "fast"])
def test_a_repeated_message_id_is_accepted_and_delivered_once(
    platform, consumer_factory, committed, reliability
):
    topic = f"Idem{reliability.title()}:T"
    _topic(committed, topic, reliability=reliability)
    consumer = consumer_factory()
    _subscribe(platform, consumer.url, topic)
    message_id = f"urn:uuid:{uuid.uuid4()}"
    body = notify_xml((topic, "<m xmlns='urn:t'>once</m>"), (topic, "<m xmlns='urn:t'>twice</m>"))

    first = soap_call(platform.endpoint, body, message_id=message_id)
    again = soap_call(platform.endpoint, body, message_id=message_id)
    other = soap_call(platform.endpoint, notify_xml((topic, "<m xmlns='urn:t'>after</m>")))

    assert (first.status, again.status, other.status) == (202, 202, 202)
    assert consumer.wait_for(3)
    time.sleep(1.0)  # a second copy, if any, would arrive within this
    assert _texts(consumer) == ["once", "twice", "after"]


def test_a_repeated_idempotency_key_header_is_delivered_once(platform, consumer_factory):
    import httpx

    consumer = consumer_factory()
    _subscribe(platform, consumer.url, "ALL:ALARM:ALARM1:ALARM13")
    key = uuid.uuid4().hex
    body = notify_xml(("ALL:ALARM:ALARM1:ALARM13", "<m xmlns='urn:t'>keyed</m>"))
    envelope = (
        f'<s:Envelope xmlns:s="http://schemas.xmlsoap.org/soap/envelope/" '
        f'xmlns:wsnt="http://docs.oasis-open.org/wsn/b-2"><s:Body>{body}</s:Body></s:Envelope>'
    )
    headers = {"Content-Type": "text/xml; charset=utf-8", "Idempotency-Key": key}

    answers = [
        httpx.post(platform.endpoint, content=envelope, headers=headers).status_code
        for _ in range(2)
    ]

    assert answers == [202, 202]
    assert consumer.wait_for(1)
    time.sleep(1.0)  # a second copy, if any, would arrive within this
    assert _texts(consumer) == ["keyed"]


def test_higher_priority_topics_overtake_lower_ones_in_a_subscriptions_queue(
    platform, consumer_factory, committed
):
    _topic(committed, "Prio:Low", priority=1)
    _topic(committed, "Prio:High", priority=8)
    consumer = consumer_factory()
    address = _subscribe(platform, consumer.url, "Prio")
    pause = "<wsnt:PauseSubscription/>"
    assert soap_call(platform.endpoint, pause, to=address).status == 200

    for topic, text in [("Prio:Low", f"low{i}") for i in range(3)] + [
        ("Prio:High", f"high{i}") for i in range(3)
    ]:
        res = soap_call(platform.endpoint, notify_xml((topic, f"<m xmlns='urn:t'>{text}</m>")))
        assert res.status == 202, res.body
    r = platform.redis()
    sid = address.rstrip("/").rsplit("/", 1)[1]

    def queued() -> int:
        return sum(r.llen(k) for k in state.queue_keys(sid))

    assert wait_until(lambda: queued() >= 6, timeout=30), f"{queued()} queued"
    assert queued() == 6
    resume = "<wsnt:ResumeSubscription/>"
    assert soap_call(platform.endpoint, resume, to=address).status == 200

    assert consumer.wait_for(6)
    assert _texts(consumer) == ["high0", "high1", "high2", "low0", "low1", "low2"]


def test_a_consumers_window_bounds_the_messages_in_flight_over_all_its_subscriptions(
    platform, consumer_factory, committed
):
    from dispatch.services import consumer_limit_set

    consumer = consumer_factory(delay=0.3)
    committed(consumer_limit_set, consumer=consumer.url, window=2, rate=None)
    topics = [f"Window:T{i}" for i in range(4)]
    for topic in topics:
        _topic(committed, topic)
        _subscribe(platform, consumer.url, topic)

    for i in range(3):
        for topic in topics:
            soap_call(platform.endpoint, notify_xml((topic, f"<m xmlns='urn:t'>{topic}-{i}</m>")))

    assert consumer.wait_for(12, timeout=60), platform.logs()
    assert consumer.max_inflight <= 2
    assert sorted(_texts(consumer)) == sorted(f"{t}-{i}" for t in topics for i in range(3))


def test_a_consumers_rate_limit_spreads_its_deliveries_over_time(
    platform, consumer_factory, committed
):
    from dispatch.services import consumer_limit_set

    consumer = consumer_factory()
    committed(consumer_limit_set, consumer=consumer.url, window=None, rate=4)
    _topic(committed, "Rate:T")
    _subscribe(platform, consumer.url, "Rate:T")

    body = notify_xml(*[("Rate:T", f"<m xmlns='urn:t'>{i}</m>") for i in range(16)])
    assert soap_call(platform.endpoint, body).status == 202

    assert consumer.wait_for(16, timeout=60), platform.logs()
    assert _texts(consumer) == [str(i) for i in range(16)]
    # 4 per second with a burst of 4: no second ever sees more than 8 of them.
    times = sorted(t for t, status in consumer.posts if status == 200)
    sizes = [len(r.raw.split(b"NotificationMessage>")) // 2 for r in _first_of_each_post(consumer)]
    arrivals = [t for t, n in zip(times, sizes, strict=True) for _ in range(n)]
    assert max(sum(1 for u in arrivals if t <= u < t + 1.0) for t in arrivals) <= 8


def _first_of_each_post(consumer):  # type: ignore[no-untyped-def]
    seen, out = set(), []
    for r in consumer.received:
        if id(r.raw) not in seen:
            seen.add(id(r.raw))
            out.append(r)
    return out


def test_pull_points_hold_to_their_depth_by_dropping_the_oldest_or_refusing(settings):
    import redis

    from dispatch.fanout import pulls_bound

    r = redis.Redis.from_url(settings.REDIS_URL)
    settings.HPWSN_PULLPOINT_MAX_DEPTH = 2
    for policy, kept in (("drop_oldest", [b"3", b"4"]), ("refuse", [b"1", b"2"])):
        settings.HPWSN_PULLPOINT_OVERFLOW = policy
        key = state.pullpoint_key("depth-test")
        r.delete(key)
        r.rpush(key, b"1", b"2", b"3", b"4")
        pulls_bound(r, {"depth-test": 4})
        assert r.lrange(key, 0, -1) == kept
        r.delete(key)


def test_a_pull_point_nobody_reads_is_destroyed_after_its_idle_time(settings, db):
    from datetime import timedelta

    from django.utils import timezone

    from subscriptions.models import PullPoint
    from subscriptions.services import pull_point_create, pull_points_expire

    settings.HPWSN_PULLPOINT_IDLE_S = 3600
    idle = pull_point_create(base_url="http://127.0.0.1")
    used = pull_point_create(base_url="http://127.0.0.1")
    long_ago = timezone.now() - timedelta(hours=2)
    PullPoint.objects.filter(id=idle.id).update(created_at=long_ago, last_used_at=long_ago)
    PullPoint.objects.filter(id=used.id).update(created_at=long_ago, last_used_at=timezone.now())

    assert pull_points_expire() == 1

    assert PullPoint.objects.get(id=idle.id).destroyed_at is not None
    assert PullPoint.objects.get(id=used.id).destroyed_at is None
