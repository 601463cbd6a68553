"""/metrics and the dashboard's queue tables never show a subscription's or pull point's id.

The id is in the address that renews, ends or reads it; /metrics needs no token by default.
"""

from __future__ import annotations

import re

import httpx
import pytest

from hpwsn_site import state
from tests.support import notify_xml, soap_call, subscribe_xml, wait_or_fail

pytestmark = pytest.mark.integration

TOPIC = "Monitoring:Metrics"  # anonymous callers may publish and subscribe (conftest)


def _address_id(res) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    assert res.status == 200, res.body
    address = res.findtext(".//wsa:Address")
    assert address
    return address, address.rstrip("/").rsplit("/", 1)[-1]


def test_queue_gauges_label_subscriptions_by_a_tag_not_by_their_id(
    platform, consumer_factory, staff, db_access
):
    from monitoring.selectors import queue_depths

    consumer = consumer_factory()
    address, sub_id = _address_id(soap_call(platform.endpoint, subscribe_xml(consumer.url, TOPIC)))
    pp_address, pp_id = _address_id(soap_call(platform.endpoint, "<wsnt:CreatePullPoint/>"))
    _address_id(soap_call(platform.endpoint, subscribe_xml(pp_address, TOPIC)))
    paused = soap_call(platform.endpoint, "<wsnt:PauseSubscription/>", to=address)
    assert paused.status == 200, paused.body
    for i in range(3):
        note = notify_xml((TOPIC, f"<e:m xmlns:e='urn:t'>{i}</e:m>"))
        assert soap_call(platform.endpoint, note).status == 202
    r = platform.redis()
    wait_or_fail(
        lambda: (
            sum(r.llen(k) for k in state.queue_keys(sub_id)) == 3
            and r.llen(state.pullpoint_key(pp_id)) == 3
        ),
        15,
        "the messages queued for the paused subscription and the pull point",
    )

    scraped: dict[str, str] = {}

    def own_gauge() -> list[str]:
        # The web process may list the new subscription a few seconds later (its index is
        # rebuilt at most every 5 s for the queue figures).
        scraped["text"] = httpx.get(platform.base_url + "/metrics", timeout=10).text
        return [
            line
            for line in scraped["text"].splitlines()
            if line.startswith("hpwsn_subscription_queue_length{")
            and f'consumer="127.0.0.1:{consumer.port}"' in line
        ]

    wait_or_fail(lambda: len(own_gauge()) == 1, 15, "the paused subscription's queue gauge")
    text = scraped["text"]
    queues = queue_depths()

    [line] = own_gauge()
    assert line.endswith(" 3.0")
    assert re.search(r'subscription="[0-9a-f]{12}"', line), line
    for secret in (sub_id, pp_id, sub_id.replace("-", ""), pp_id.replace("-", "")):
        assert secret not in text
        assert secret not in repr(queues)
    assert [row["depth"] for row in queues["pullpoints"] if row["depth"] == 3]
