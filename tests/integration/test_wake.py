"""A duplicate Subscribe is a sign of life: what waits in retry back-off is retried at once."""

from __future__ import annotations

import time

import pytest

from hpwsn_site import state
from tests.support import (
    ANONYMOUS_ALLOWED,
    notify_xml,
    soap_call,
    subscribe_xml,
    topic_with_policy,
    wait_or_fail,
)

pytestmark = pytest.mark.integration

TOPIC = "WakeAlarms"
# After the first failed push, the next attempt would come five minutes later.
SCHEDULE = "300,300"


def _subscribe(platform, consumer_url: str) -> str:  # type: ignore[no-untyped-def]
    res = soap_call(platform.endpoint, subscribe_xml(consumer_url, TOPIC))
    assert res.status == 200, res.body
    address = res.findtext(".//wsnt:SubscriptionReference/wsa:Address")
    assert address
    return address


def test_a_duplicate_subscribe_retries_a_consumer_in_back_off_now(
    platform, committed, consumer_factory
):
    committed(topic_with_policy, TOPIC, retry_schedule=SCHEDULE, **ANONYMOUS_ALLOWED)
    consumer = consumer_factory(fail_first=1, fail_status=500)  # down once, then back
    address = _subscribe(platform, consumer.url)
    sid = address.rsplit("/", 1)[-1]
    r = platform.redis()
    note = notify_xml((TOPIC, "<w:ev xmlns:w='urn:wake'>knock</w:ev>"))
    assert soap_call(platform.endpoint, note).status == 202
    wait_or_fail(
        lambda: len(consumer.posts) == 1 and r.zscore(state.RETRY, sid) is not None,
        15,
        "the failed push and its retry scheduled",
    )
    assert r.zscore(state.RETRY, sid) > time.time() + 200  # minutes away

    again = _subscribe(platform, consumer.url)

    assert again == address
    assert consumer.wait_for(1, timeout=15), platform.logs()
    assert consumer.payload_texts() == ["knock"]
    assert [status for _t, status in consumer.posts] == [500, 200]
    assert r.zscore(state.RETRY, sid) is None
