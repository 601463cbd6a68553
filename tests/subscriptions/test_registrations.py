"""Demand sync in process, against a real publisher endpoint: run twice, it asks once."""

from __future__ import annotations

import uuid

import pytest

from hpwsn.wsn import TopicRef
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


@pytest.mark.django_db
def test_an_expired_demand_registration_ends_its_subscription_at_the_publisher(
    publisher, django_capture_on_commit_callbacks, request
):
    from datetime import timedelta

    from django.utils import timezone

    from subscriptions.models import PublisherRegistration
    from subscriptions.registrations import registration_release
    from subscriptions.services import subscriptions_expire

    held = f"{publisher.url}subscriptions/1"
    PublisherRegistration.objects.create(
        publisher_address=publisher.url,
        topic_paths=["Gone:Feed"],
        demand=True,
        demand_state={"Gone:Feed": {"address": held, "paused": False}},
        termination_time=timezone.now() - timedelta(seconds=1),
    )
    live = PublisherRegistration.objects.create(publisher_address=publisher.url)

    with django_capture_on_commit_callbacks(execute=True):
        subscriptions_expire()

    assert list(PublisherRegistration.objects.values_list("id", flat=True)) == [live.id]
    sent = request.getfixturevalue("_tasks_of_tests_without_the_platform")
    queued = [args for name, args in sent if "release" in name]
    assert queued == [(publisher.url, [held])]
    assert publisher.operations() == []  # nothing called inside the sweep itself
    for _ in range(2):  # the task, run twice: the second Unsubscribe does no harm
        registration_release(publisher_address=publisher.url, subscription_addresses=[held])
    assert publisher.calls == [("Unsubscribe", held), ("Unsubscribe", held)]


@pytest.mark.django_db
def test_subscriptions_ask_for_a_demand_sync_once_a_demand_registration_exists(
    monkeypatch, django_capture_on_commit_callbacks, django_assert_num_queries
):  # type: ignore[no-untyped-def]
    """Every Subscribe and Unsubscribe asks whether a demand publisher must hear of it: the
    answer comes from a marker in Redis, not a query each time, and a registration made or
    destroyed changes it at once."""
    from subscriptions import tasks
    from subscriptions.registrations import (
        demand_changed,
        registration_create,
        registration_destroy,
    )
    from topics.acl import ADMIN_GROUP, Principal
    from topics.services import topic_create

    syncs: list[int] = []
    monkeypatch.setattr(tasks.registrations_demand_sync, "delay", lambda: syncs.append(1))
    topic_create(path="Asked:Feed")
    state.bump(state.VERSION_TOPICS)
    state.get_redis().delete(state.DEMAND)

    def changed() -> None:
        with django_capture_on_commit_callbacks(execute=True):
            demand_changed()

    with django_assert_num_queries(1):  # no marker yet: the database says no
        changed()
    with django_assert_num_queries(0):  # the marker says no
        changed()
    assert syncs == []

    admin = Principal(name="ops", groups=frozenset({ADMIN_GROUP}))
    with django_capture_on_commit_callbacks(execute=True):
        reg = registration_create(
            publisher_address="http://127.0.0.1:9/publisher",
            topics=[TopicRef(text="Asked:Feed", dialect=None, nsmap={})],
            demand=True,
            initial_termination_time=None,
            base_url="http://127.0.0.1:9",
            principal=admin,
        )
    assert syncs == [1]
    with django_assert_num_queries(0):  # the registration marked it
        changed()
    assert syncs == [1, 1]
    assert int(state.get_redis().ttl(state.DEMAND)) > 0  # a marker a write missed ends

    with django_capture_on_commit_callbacks(execute=True):
        registration_destroy(registration_id=str(reg.id), principal=admin)
    with django_assert_num_queries(1):  # gone: the database is asked again, and says no
        changed()
    assert syncs == [1, 1]
