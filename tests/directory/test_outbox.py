"""Every registration service that makes, renews or removes one queues its directory write (in
process: no directory is contacted, the outbox row is what is observed)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from directory.models import RegistrationWrite
from hpwsn import ns
from hpwsn.wsn import TopicRef
from hpwsn_site import state
from subscriptions import registrations
from subscriptions.models import PublisherRegistration
from tests.support import ANONYMOUS_ALLOWED, topic_with_policy
from topics.acl import ANONYMOUS

pytestmark = pytest.mark.django_db

TOPIC = "Outboxed:Feed"


@pytest.fixture
def directory_on(settings):  # type: ignore[no-untyped-def]
    # Configured but never reached: the flush is a task these tests do not run.
    settings.HPWSN_LDAP_URL = "ldap://127.0.0.1:9/"
    topic_with_policy(TOPIC, root=ANONYMOUS_ALLOWED)
    state.bump(state.VERSION_TOPICS)
    yield
    # The topics are rolled back: the next test's tree must not be this one.
    state.bump(state.VERSION_TOPICS)


def _create() -> PublisherRegistration:
    return registrations.registration_create(
        publisher_address="http://outboxed.example/wsn",
        topics=[TopicRef(text=TOPIC, dialect=ns.DIALECT_SIMPLE, nsmap={})],
        demand=False,
        initial_termination_time="PT1H",
        base_url="http://broker.example",
    )


def _version(reg_id: object) -> int | None:
    row = RegistrationWrite.objects.filter(registration_id=reg_id).first()
    return None if row is None else row.version


def test_each_change_of_a_registration_queues_its_directory_write(directory_on):
    reg = _create()
    assert _version(reg.id) == 1

    registrations.registration_renew(
        registration_id=str(reg.id), termination_time="PT2H", principal=ANONYMOUS
    )
    assert _version(reg.id) == 2

    PublisherRegistration.objects.filter(id=reg.id).update(
        termination_time=timezone.now() - timedelta(seconds=1)
    )
    assert registrations.registrations_expire() == 1
    assert not PublisherRegistration.objects.filter(id=reg.id).exists()
    assert _version(reg.id) == 3  # the flush deletes the entry
