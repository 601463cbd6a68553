"""The admin shows subscriptions and the directory's sync state, and deletes none of them: its
delete removes a row alone, where the services also free the queue, the Redis keys and the
directory entry (which otherwise brings the subscription back at the next start)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from directory.models import SubscriptionWrite
from hpwsn.wsn import TopicRef
from subscriptions import services as subs
from subscriptions.models import Subscription
from topics import services as topics
from topics.acl import Principal

ADMIN = Principal(name="admin1", groups=frozenset({"hpwsn-admins"}))


@pytest.mark.django_db(transaction=True)
def test_a_superuser_cannot_delete_a_subscription_or_a_sync_row_from_the_admin() -> None:
    admin_client = Client()
    admin_client.force_login(
        User.objects.create_superuser("root-admin", "root@example.org", "pw"),
        backend="django.contrib.auth.backends.ModelBackend",  # a local account
    )
    topics.topic_create(path="Plant:Admin")
    sub, _created = subs.subscription_create(
        consumer_address="http://127.0.0.1:9/admin-delete",
        topic=TopicRef(text="Plant:Admin", dialect=None, nsmap={}),
        content=None,
        initial_termination_time=None,
        soap_version="1.1",
        use_raw=False,
        base_url="http://testserver",
        principal=ADMIN,
    )
    sid = str(sub.id)
    write, _made = SubscriptionWrite.objects.get_or_create(
        subscription_id=sub.id, defaults={"next_try_at": timezone.now()}
    )

    page = admin_client.get("/admin/subscriptions/subscription/")
    assert page.status_code == 200
    assert sid in page.content.decode()
    assert "delete_selected" not in page.content.decode()
    assert admin_client.get(f"/admin/subscriptions/subscription/{sid}/delete/").status_code == 403
    admin_client.post(
        "/admin/subscriptions/subscription/",
        {"action": "delete_selected", "_selected_action": [sid], "post": "yes"},
    )
    assert Subscription.objects.filter(id=sub.id).exists()

    url = f"/admin/directory/subscriptionwrite/{write.pk}/delete/"
    assert admin_client.get(url).status_code == 403
    admin_client.post(
        "/admin/directory/subscriptionwrite/",
        {"action": "delete_selected", "_selected_action": [str(write.pk)], "post": "yes"},
    )
    assert SubscriptionWrite.objects.filter(pk=write.pk).exists()
