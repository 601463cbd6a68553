"""The slow-consumer probe, as a client would run it: a reliable topic, a lease much shorter
than the consumer's first answer, a backlog built while the subscription is paused, then a
steady feed. With two pumps on one queue (the safety net starting a second one when the lease
ran out) the broker lost batches here and sent others twice."""

from __future__ import annotations

import threading
import time

from tests.integration.test_kill import TOPIC, _notify, private_platform
from tests.support import soap_call, subscribe_xml, wait_until

BACKLOG = 300
FEED_S = 10
FEED_RATE = 100  # notifications per second
PER_NOTIFY = 10


def test_a_consumer_slower_than_the_lease_loses_nothing_and_gets_no_duplicate(
    tmp_path, consumer_factory
):
    consumer = consumer_factory(first_delay=9.0)  # then answers at once
    with private_platform(
        tmp_path, HPWSN_LEASE_S="2", HPWSN_PUSH_TIMEOUT_S="15", HPWSN_PUSH_BATCH="20"
    ) as p:
        res = soap_call(p.endpoint, subscribe_xml(consumer.url, TOPIC))
        assert res.status == 200, res.body
        address = res.findtext(".//wsnt:SubscriptionReference/wsa:Address")
        assert address
        assert soap_call(p.endpoint, "<wsnt:PauseSubscription/>", to=address).status == 200

        total = 0

        def publish(count: int) -> None:
            nonlocal total
            for _ in range(count // PER_NOTIFY):
                res = soap_call(p.endpoint, _notify(total))
                assert res.status == 202, res.body
                total += PER_NOTIFY

        publish(BACKLOG)
        assert soap_call(p.endpoint, "<wsnt:ResumeSubscription/>", to=address).status == 200
        feeding = threading.Thread(
            target=lambda: [
                (publish(FEED_RATE // 10), time.sleep(0.1)) for _ in range(FEED_S * 10)
            ],
            daemon=True,
        )
        feeding.start()
        feeding.join(timeout=FEED_S * 6)
        assert not feeding.is_alive()

        expected = list(range(total))
        wait_until(lambda: len(set(_numbers(consumer))) >= total, timeout=120, interval=0.5)
        numbers = _numbers(consumer)
        missing = sorted(set(expected) - set(numbers))
        assert not missing, f"{len(missing)} of {total} never arrived\n" + p.logs()
        assert list(dict.fromkeys(numbers)) == expected  # in order
        # The lease is renewed while the slow push is in flight: no second pump, no duplicate.
        assert len(numbers) == total, f"{len(numbers) - total} duplicates"


def _numbers(consumer) -> list[int]:  # type: ignore[no-untyped-def]
    return [int(t) for t in consumer.payload_texts()]
