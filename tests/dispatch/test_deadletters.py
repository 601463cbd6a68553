"""Redriving dead letters: redrives racing on the same letters queue each letter once."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from dispatch.deadletters import dead_letters_redrive
from dispatch.models import DeadLetter
from hpwsn.wsn import TopicRef
from hpwsn_site import state
from subscriptions import services as subs
from topics import services as topics
from topics.acl import Principal

ADMIN = Principal(name="admin1", groups=frozenset({"hpwsn-admins"}))


def _letters(sub_id: str, count: int) -> set[bytes]:
    """`count` letters of the subscription; the items a redrive queues for them."""
    rows = [
        DeadLetter.objects.create(
            subscription_id=sub_id,
            consumer_address="http://127.0.0.1:9/letters",
            notification_id=uuid.uuid4().hex,
            topic="Plant:Hall",
            message=f"<m>{i}</m>".encode(),
            reason=DeadLetter.Reason.EXHAUSTED,
        )
        for i in range(count)
    ]
    return {row.queue_item for row in rows}


def _race(threads: int, fn: Callable[[], int]) -> list[int]:
    """`fn` on that many threads at once, each on its own database connection; their answers."""
    start = threading.Barrier(threads)
    answers: list[int] = []

    def run() -> None:
        try:
            start.wait(timeout=10)
            answers.append(fn())
        finally:
            connection.close()

    running = [threading.Thread(target=run) for _ in range(threads)]
    for t in running:
        t.start()
    for t in running:
        t.join(timeout=30)
    return answers


@pytest.mark.django_db(transaction=True)
def test_redrives_racing_on_the_same_letters_queue_each_letter_once(own_redis: Any) -> None:
    topics.topic_create(path="Plant:Hall")
    sub, _created = subs.subscription_create(
        consumer_address="http://127.0.0.1:9/letters",
        topic=TopicRef(text="Plant:Hall", dialect=None, nsmap={}),
        content=None,
        initial_termination_time=None,
        soap_version="1.1",
        use_raw=False,
        base_url="http://testserver",
        principal=ADMIN,
    )
    sub_id = str(sub.id)
    queued: list[bytes] = []
    for _round in range(3):
        items = _letters(sub_id, 5)

        counts = _race(8, lambda: dead_letters_redrive(subscription_id=sub_id))

        assert sum(counts) == 5, counts
        queued = [i for k in state.queue_keys(sub_id) for i in own_redis.lrange(k, 0, -1)]
        assert len(queued) == len(set(queued))
        assert items <= set(queued)
    assert len(queued) == 15
    assert not DeadLetter.objects.filter(subscription_id=sub_id, redriven_at__isnull=True).exists()


def _paused(sub_id: str, paused: bool) -> None:
    subs.subscription_set_state(subscription_id=sub_id, paused=paused, principal=ADMIN)


def test_a_redriven_letter_whose_body_expired_while_it_waited_is_still_pushed(
    db: Any, own_redis: Any, settings: Any
) -> None:
    """Its row, kept until the consumer has taken it, still holds the message. Before, the pump
    counted it as expired and deleted the row: the letter was gone, never pushed."""
    from dispatch.items import item_id
    from dispatch.pump import Pump
    from dispatch.push import Outcome
    from tests.dispatch.test_checkpoint import _at, _subscription

    settings.HPWSN_CONSUMER_WINDOW = 0
    sub_id = _subscription()
    _at(own_redis, 0)
    _paused(sub_id, True)
    (item,) = _letters(sub_id, 1)
    assert dead_letters_redrive(subscription_id=sub_id) == 1
    # The subscription stays paused past the retention: the body queued for the letter expires.
    own_redis.delete(state.payload_key(item_id(item)))
    _paused(sub_id, False)
    pushed: list[tuple[str, bytes]] = []

    def consumer(_entry, batch):  # type: ignore[no-untyped-def]
        pushed.extend(batch.live)
        return Outcome(ok=True, status=200)

    Pump(sub_id, push=consumer, keep_alive=False).run()

    assert pushed == [(item_id(item), b"<m>0</m>")]
    assert not DeadLetter.objects.filter(subscription_id=sub_id).exists()  # taken: its row goes


def test_a_redriven_letter_dropped_by_the_queue_bound_can_be_redriven_again(
    db: Any, own_redis: Any, settings: Any
) -> None:
    """Before, its item went with the oldest messages and its row stayed marked redriven for
    ever: never pushed, and refused by every redrive and delete."""
    import time

    from dispatch.selectors import dead_letters
    from dispatch.services import STATS
    from subscriptions.selectors import subscription_index
    from tests.dispatch.test_bodies import _publish
    from tests.dispatch.test_checkpoint import _at, _subscription

    settings.HPWSN_FANOUT_TICK_S = 0
    settings.HPWSN_DEDUP_WINDOW_S = 0
    _at(own_redis, 0)
    sub_id = _subscription()
    assert subs.subscription_suspend(subscription_id=sub_id)
    state.bump(state.VERSION_SUBS)
    subscription_index()  # the fan-out sees it suspended now
    (item,) = _letters(sub_id, 1)
    assert dead_letters_redrive(subscription_id=sub_id) == 1
    settings.HPWSN_QUEUE_MAX_DEPTH = 2
    time.sleep(0.01)  # accepted after the subscription was made

    ids = _publish(3)

    queued = own_redis.lrange(state.queue_key(sub_id), 0, -1)
    assert [q.split(b"|")[0].decode() for q in queued] == ids[1:]
    assert [x.queue_item for x in dead_letters(subscription_id=sub_id, redriven=False)] == [item]
    assert dead_letters_redrive(subscription_id=sub_id) == 1
    assert int(own_redis.hget(STATS, "dropped") or 0) == 1  # the message; the letter went back
