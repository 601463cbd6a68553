"""A subscription's push format survives the directory: written to its entry, restored from it."""

from __future__ import annotations

import json
import uuid

import pytest

from directory.selectors import subscription_view_of
from directory.services import subscription_restore
from subscriptions.models import Subscription


@pytest.mark.django_db
def test_a_cloudevents_subscription_is_restored_from_its_entry_as_cloudevents():
    sub = Subscription.objects.create(
        id=uuid.uuid4(),
        consumer_address="http://127.0.0.1:1/hook",
        dedup_key="k-ce",
        format=Subscription.Format.CLOUDEVENTS,
    )
    view = subscription_view_of(sub)
    assert json.loads(view["details"])["format"] == "cloudevents"
    sub_id = sub.id
    sub.delete()
    restored = subscription_restore(view=view)
    assert restored.id == sub_id
    assert restored.format == Subscription.Format.CLOUDEVENTS


@pytest.mark.django_db
def test_the_entry_of_a_wsn_subscription_is_unchanged():
    sub = Subscription.objects.create(
        id=uuid.uuid4(), consumer_address="http://127.0.0.1:1/soap", dedup_key="k-wsn"
    )
    assert "format" not in json.loads(subscription_view_of(sub)["details"])
