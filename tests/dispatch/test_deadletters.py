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
