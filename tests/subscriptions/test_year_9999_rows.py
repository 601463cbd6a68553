"""Rows stored with a termination time after year 9999 (UTC) before such times were refused: the
migration that ends year 9999 for them makes their tables readable again."""

from __future__ import annotations

import importlib
from datetime import UTC, datetime

import pytest
from django.db import DataError, connection

from tests.support import subscription_made
from topics import services as topics
from topics.acl import Principal

ADMIN = Principal(name="admin1", groups=frozenset({"hpwsn-admins"}))
migration = importlib.import_module("subscriptions.migrations.0014_termination_within_year_9999")


@pytest.mark.django_db(transaction=True)
def test_rows_after_year_9999_become_the_last_instant_of_it_and_read_again():
    from django.apps import apps

    from subscriptions.models import PublisherRegistration, Subscription

    if connection.vendor != "postgresql":
        pytest.skip("only PostgreSQL could store such a time")
    topics.topic_create(path="Far")
    sub, _ = subscription_made("http://127.0.0.1:9/c", "Far", ADMIN)
    reg = PublisherRegistration.objects.create(publisher_address="http://127.0.0.1:9/p")
    kept, _ = subscription_made("http://127.0.0.1:9/d", "Far", ADMIN, termination="PT1H")
    with connection.cursor() as cursor:
        for table, row in (
            ("subscriptions_subscription", sub.id),
            ("subscriptions_publisherregistration", reg.id),
        ):
            cursor.execute(
                f"UPDATE {table} SET termination_time = '10000-01-01 05:00:00+00' WHERE id = %s",  # noqa: S608 (two table names of this test)
                [row],
            )
    with pytest.raises(DataError, match="year 10K"):  # what every process met, loading the table
        list(Subscription.objects.all())

    with connection.schema_editor() as editor:
        migration.within_year_9999(apps, editor)

    last = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
    assert Subscription.objects.get(id=sub.id).termination_time == last
    assert PublisherRegistration.objects.get(id=reg.id).termination_time == last
    unchanged = Subscription.objects.get(id=kept.id).termination_time
    assert unchanged == kept.termination_time
    assert unchanged.year < 9999
