"""A staff login and topics of their own for the monitoring tests, committed for the platform."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

TOPICS = ("Monitoring:WS", "Monitoring:Metrics", "Monitoring:Browser")


@dataclass(frozen=True)
class Staff:
    username: str
    password: str


@pytest.fixture(scope="session")
def staff(django_db_setup, django_db_blocker) -> Staff:  # type: ignore[no-untyped-def]
    """A staff user and the test topics, committed outside any test's transaction.

    The platform's web process reads them from the shared test database, so they must be
    committed (a session fixture runs before the function-scoped transaction opens).
    """
    from django.contrib.auth import get_user_model

    from hpwsn_site import state
    from topics.models import Topic
    from topics.services import topic_create

    creds = Staff("monitor", "monitor-pass-7f3a")
    with django_db_blocker.unblock():
        user_model = get_user_model()
        user, _ = user_model.objects.get_or_create(username=creds.username)
        user.is_staff = True
        user.set_password(creds.password)
        user.save()
        for path in TOPICS:
            topic_create(path=path)
        # A new root refuses anonymous callers unless its policy allows them.
        roots = {path.split(":", 1)[0] for path in TOPICS}
        Topic.objects.filter(path__in=roots).update(
            anonymous_publish=True, anonymous_subscribe=True
        )
        state.bump(state.VERSION_TOPICS)
    return creds
