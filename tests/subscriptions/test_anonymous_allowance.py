"""Anonymous callers' allowances of subscriptions, pull points and publisher registrations are
counted per client address: one of them cannot use up the allowance of all the others."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from django.test import Client

from hpwsn import ns
from hpwsn_site import state
from hpwsn_site.soap import Exchange, soap_exchange
from subscriptions import services as subs
from subscriptions.models import PublisherRegistration, PullPoint, Subscription
from tests.support import ANONYMOUS_ALLOWED, subscribe_xml, topic_with_policy

FIRST, SECOND = "198.51.100.7", "203.0.113.9"
CT11 = "text/xml; charset=utf-8"


def _soap(body_xml: str, *, client: str) -> Exchange:
    """One anonymous SOAP 1.1 call from `client`, as the endpoint serves it."""
    doc = (
        f'<s:Envelope xmlns:s="{ns.SOAP11}" xmlns:wsnt="{ns.WSNT}" xmlns:wsa="{ns.WSA}" '
        f'xmlns:wsnbr="{ns.WSNBR}"><s:Body>{body_xml}</s:Body></s:Envelope>'
    )
    return asyncio.run(
        soap_exchange(
            data=doc.encode(),
            ctype=CT11,
            base="http://testserver",
            resource_id=None,
            client=client,
        )
    )


def _fault_of(ex: Exchange) -> str:
    return ex.body.decode() if ex.status >= 400 else ""


@pytest.fixture
def open_topic(transactional_db) -> str:  # type: ignore[no-untyped-def]
    """A root topic anonymous callers may publish and subscribe on."""
    path = f"Anon{uuid.uuid4().hex[:8]}"
    topic_with_policy(path, **ANONYMOUS_ALLOWED)
    state.bump(state.VERSION_TOPICS)  # whatever tree an earlier test left in this process
    return path


def test_anonymous_subscribers_at_two_addresses_each_hold_the_full_allowance(
    open_topic, settings, monkeypatch
) -> None:
    monkeypatch.setattr(subs, "_held", {})  # what this process counted in earlier tests
    settings.HPWSN_MAX_SUBSCRIPTIONS_PER_OWNER = 2

    def subscribe(client: str, n: int) -> Exchange:
        consumer = f"http://127.0.0.1:9/anon/{client}/{n}"
        return _soap(subscribe_xml(consumer, open_topic), client=client)

    for n in range(2):
        assert subscribe(FIRST, n).status == 200
        second = subscribe(SECOND, n)
        assert second.status == 200, _fault_of(second)

    refused = subscribe(FIRST, 2)

    assert refused.status == 500
    assert b"SubscribeCreationFailedFault" in refused.body
    assert b"HPWSN_MAX_SUBSCRIPTIONS_PER_OWNER" in refused.body
    assert Subscription.objects.filter(owner="anonymous").count() == 4
    # The owner stays "anonymous"; the address only says whose allowance it counts against.
    assert set(Subscription.objects.values_list("created_from", flat=True)) == {FIRST, SECOND}


def test_anonymous_callers_at_two_addresses_each_hold_the_full_pull_point_allowance(
    transactional_db, settings
) -> None:
    settings.HPWSN_MAX_PULLPOINTS_PER_OWNER = 2

    def create(client: str) -> Exchange:
        return _soap("<wsnt:CreatePullPoint/>", client=client)

    for _ in range(2):
        assert create(FIRST).status == 200
        second = create(SECOND)
        assert second.status == 200, _fault_of(second)

    refused = create(SECOND)

    assert refused.status == 500
    assert b"UnableToCreatePullPointFault" in refused.body
    assert b"HPWSN_MAX_PULLPOINTS_PER_OWNER" in refused.body
    assert PullPoint.objects.filter(owner="anonymous").count() == 4


def test_anonymous_publishers_at_two_addresses_each_hold_the_full_registration_allowance(
    open_topic, settings
) -> None:
    settings.HPWSN_MAX_REGISTRATIONS_PER_OWNER = 2

    def register(client: str) -> Exchange:
        return _soap(
            f"<wsnbr:RegisterPublisher><wsnbr:PublisherReference><wsa:Address>"
            f"http://127.0.0.1:9/publisher/{client}</wsa:Address></wsnbr:PublisherReference>"
            f'<wsnbr:Topic Dialect="{ns.DIALECT_SIMPLE}">{open_topic}</wsnbr:Topic>'
            "</wsnbr:RegisterPublisher>",
            client=client,
        )

    for _ in range(2):
        assert register(FIRST).status == 200
        second = register(SECOND)
        assert second.status == 200, _fault_of(second)

    refused = register(FIRST)

    assert refused.status == 500
    assert b"PublisherRegistrationRejectedFault" in refused.body
    assert b"HPWSN_MAX_REGISTRATIONS_PER_OWNER" in refused.body
    assert PublisherRegistration.objects.filter(owner="anonymous").count() == 4


def test_the_rest_api_counts_anonymous_pull_points_by_client_address(
    transactional_db, settings
) -> None:
    settings.HPWSN_MAX_PULLPOINTS_PER_OWNER = 1
    first, second = Client(REMOTE_ADDR=FIRST), Client(REMOTE_ADDR=SECOND)

    assert first.post("/api/v1/pullpoints").status_code == 201
    made = second.post("/api/v1/pullpoints")
    assert made.status_code == 201, made.content

    refused = first.post("/api/v1/pullpoints")

    assert refused.status_code == 403
    assert refused.json()["type"] == "urn:hpwsn:problem:UnableToCreatePullPointFault"
