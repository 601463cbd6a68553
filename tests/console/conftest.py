"""Console users, one per role, as the directory login mirrors them: Django users in groups."""

from __future__ import annotations

import uuid

import pytest

PASSWORD = "console-pass-51c9"


def make_user(username: str, *groups: str):  # type: ignore[no-untyped-def]
    from django.contrib.auth.models import Group, User

    user, _ = User.objects.get_or_create(username=username)
    user.set_password(PASSWORD)
    user.save()
    for name in groups:
        user.groups.add(Group.objects.get_or_create(name=name)[0])
    return user


@pytest.fixture
def admin_user(db):  # type: ignore[no-untyped-def]
    return make_user("console-admin", "hpwsn-admins")


@pytest.fixture
def operator(db):  # type: ignore[no-untyped-def]
    return make_user("console-operator", "hpwsn-operators")


@pytest.fixture
def analyst(db):  # type: ignore[no-untyped-def]
    return make_user("console-analyst", "hpwsn-analysts")


@pytest.fixture
def outsider(db):  # type: ignore[no-untyped-def]
    return make_user("console-outsider")


def add_subscription(topic_path: str, **fields: object):  # type: ignore[no-untyped-def]
    """A subscription row to a concrete topic, as Subscribe stores it."""
    from subscriptions.models import Subscription

    return Subscription.objects.create(
        consumer_address=f"http://127.0.0.1:9/{uuid.uuid4().hex[:8]}",
        topic_expression=topic_path,
        topic_path=topic_path,
        dedup_key=uuid.uuid4().hex,
        **fields,
    )
