"""Demand sync in process, against a real publisher endpoint: run twice, it asks once."""

from __future__ import annotations

import uuid

import pytest

from hpwsn_site import state
from tests.integration.test_registrations import PublisherEndpoint


@pytest.fixture
def publisher():  # type: ignore[no-untyped-def]
    endpoint = PublisherEndpoint().start()
    yield endpoint
    endpoint.stop()


def _subscribe(path: str):  # type: ignore[no-untyped-def]
    from subscriptions.models import Subscription

    sub = Subscription.objects.create(
        consumer_address="http://127.0.0.1:9/listener",
        topic_expression=path,
        topic_path=path,
        dedup_key=uuid.uuid4().hex,
    )
    state.bump(state.VERSION_SUBS)  # this process's subscription index sees it
    return sub


@pytest.mark.django_db
def test_a_demand_sync_run_twice_subscribes_and_pauses_once(publisher):
    from subscriptions.models import PublisherRegistration
    from subscriptions.registrations import registration_demand_sync
    from topics.services import topic_create

    topic_create(path="Twice:Feed")
    state.bump(state.VERSION_TOPICS)
    reg = PublisherRegistration.objects.create(
        publisher_address=publisher.url,
        topic_paths=["Twice:Feed"],
        demand=True,
        broker_address="http://127.0.0.1:9/wsn/",
    )

    registration_demand_sync(registration_id=str(reg.id))
    assert publisher.operations() == []  # nobody listens: nothing asked

    sub = _subscribe("Twice")  # a subscription to an ancestor covers the topic
    registration_demand_sync(registration_id=str(reg.id))
    registration_demand_sync(registration_id=str(reg.id))
    assert publisher.operations() == ["Subscribe"]
    reg.refresh_from_db()
    assert reg.demand_state["Twice:Feed"]["paused"] is False

    sub.delete()
    state.bump(state.VERSION_SUBS)
    registration_demand_sync(registration_id=str(reg.id))
    registration_demand_sync(registration_id=str(reg.id))
    assert publisher.operations() == ["Subscribe", "PauseSubscription"]

    _subscribe("Twice:Feed:Below")  # a subscriber below the topic also wants it
    registration_demand_sync(registration_id=str(reg.id))
    registration_demand_sync(registration_id=str(reg.id))
    assert publisher.operations() == ["Subscribe", "PauseSubscription", "ResumeSubscription"]
