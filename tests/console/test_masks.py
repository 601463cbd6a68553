"""Read-only console users see no address that grants anything: tags and consumer hosts instead.

A subscription's or pull point's id is in its address, and the address renews, ends or reads
it. Operators and admins still see addresses and act on them.
"""

from __future__ import annotations

import pytest
from django.test import Client

from console import services as console_services
from dispatch.models import DeadLetter
from subscriptions import cascades
from subscriptions.models import PublisherRegistration
from subscriptions.selectors import resource_tag
from subscriptions.services import pull_point_create
from tests.console.conftest import add_subscription
from topics.models import Topic
from topics.services import topic_create

pytestmark = pytest.mark.django_db
LOCAL = "django.contrib.auth.backends.ModelBackend"
PAGES = (
    "/console/subscriptions/",
    "/console/pullpoints/",
    "/console/deadletters/",
    "/console/audit/",
)


def _client(user) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(user, backend=LOCAL)
    return client


@pytest.fixture
def resources(db, operator):  # type: ignore[no-untyped-def]
    """A push subscription with a dead letter, a pull point fed by a pull subscription, and an
    operator's audited pause, pull point removal and redrive."""
    topic_create(path="Mask:Door")
    push = add_subscription("Mask:Door")
    push.consumer_address = "http://127.0.0.1:9/hook?token=s3cret"
    push.reference_address = f"http://testserver/wsn/subscriptions/{push.id}"
    push.save(update_fields=["consumer_address", "reference_address"])
    pp = pull_point_create(base_url="http://testserver")
    pull = add_subscription("Mask:Door", mode="pull", pull_point=pp)
    pull.consumer_address = pp.address
    pull.save(update_fields=["consumer_address"])
    DeadLetter.objects.create(
        subscription_id=str(push.id),
        consumer_address=push.consumer_address,
        notification_id="n-mask-1",
        topic="Mask:Door",
        message=b"<m/>",
        reason="exhausted",
        attempts=[{"time": 0, "status": 503, "detail": "unavailable", "duration_ms": 1}],
    )
    console_services.subscription_pause_or_resume(
        subscription_id=str(push.id), paused=True, actor=operator
    )
    gone = pull_point_create(base_url="http://testserver")
    console_services.pull_point_remove(pull_point_id=str(gone.id), actor=operator)
    secrets = [
        str(push.id),
        str(pull.id),
        str(pp.id),
        str(gone.id),
        push.consumer_address,
        pp.address,
        gone.address,
        "s3cret",
    ]
    return push, pp, secrets


def test_an_analyst_sees_tags_and_hosts_but_no_id_or_address(analyst, resources):
    push, pp, secrets = resources
    client = _client(analyst)

    pages = {url: client.get(url).content.decode() for url in PAGES}

    for url, page in pages.items():
        leaked = [s for s in secrets if s in page]
        assert not leaked, (url, leaked)
    assert f"#{resource_tag(str(push.id))}" in pages["/console/subscriptions/"]
    assert "127.0.0.1:9" in pages["/console/subscriptions/"]
    assert f"#{resource_tag(str(pp.id))}" in pages["/console/pullpoints/"]
    assert f"#{resource_tag(str(push.id))}" in pages["/console/deadletters/"]
    assert f"#{resource_tag(str(push.id))}" in pages["/console/audit/"]
    assert "subscription.pause" in pages["/console/audit/"]


def test_an_analyst_cannot_spell_out_a_pull_point_id_by_searching(analyst, resources):
    _push, pp, _secrets = resources
    client = _client(analyst)
    prefix = str(pp.id)[:8]

    pull_points = client.get("/console/pullpoints/", {"q": prefix}).content.decode()
    subscriptions = client.get(
        "/console/subscriptions/", {"q": prefix, "mode": "pull"}
    ).content.decode()
    audit = client.get("/console/audit/", {"object": prefix}).content.decode()
    by_tag = client.get("/console/pullpoints/", {"q": resource_tag(str(pp.id))}).content.decode()

    assert "No pull point." in pull_points
    assert "No subscription matches." in subscriptions
    assert "Nothing recorded." in audit
    assert f"#{resource_tag(str(pp.id))}" in by_tag


@pytest.mark.parametrize("who", ["operator", "admin_user"])
def test_operators_and_admins_still_see_addresses_owners_and_actions(who, request, resources):
    push, pp, _secrets = resources
    client = _client(request.getfixturevalue(who))

    subscriptions = client.get("/console/subscriptions/").content.decode()
    pull_points = client.get("/console/pullpoints/").content.decode()

    assert str(push.id) in subscriptions
    assert push.consumer_address.replace("&", "&amp;") in subscriptions
    assert f"/console/subscriptions/{push.id}/resume/" in subscriptions
    assert "owner: anonymous" in subscriptions
    assert pp.address in pull_points
    assert f"/console/pullpoints/{pp.id}/remove/" in pull_points


def test_an_analyst_sees_the_subscription_of_deleted_dead_letters_by_tag(
    analyst, operator, resources
):  # type: ignore[no-untyped-def]
    push, _pp, _secrets = resources
    letter = DeadLetter.objects.get(notification_id="n-mask-1")
    console_services.dead_letters_delete_by_operator(ids=[letter.id], actor=operator)

    page = _client(analyst).get("/console/audit/").content.decode()

    assert "deadletter.delete" in page
    assert str(push.id) not in page
    assert f"#{resource_tag(str(push.id))}" in page


def test_the_publishers_page_shows_an_analyst_a_tag_for_each_registration(analyst, operator):
    reg = PublisherRegistration.objects.create(
        publisher_address="http://127.0.0.1:9/producer", topic_paths=["Mask:Door"]
    )
    reg.reference_address = f"http://testserver/wsn/registrations/{reg.id}"
    reg.save(update_fields=["reference_address"])

    shown = _client(analyst).get("/console/registrations/").content.decode()
    full = _client(operator).get("/console/registrations/").content.decode()

    assert str(reg.id) not in shown
    assert f"#{resource_tag(str(reg.id))}" in shown
    assert "http://127.0.0.1:9/producer" in shown  # the publisher's own address grants nothing
    assert reg.reference_address in full


def test_an_analyst_cannot_spell_out_a_webhooks_secret_by_searching(analyst, resources):
    # The page's count of matches once answered a substring of the whole address: "token=s"
    # one, "token=x" none, and so on, character by character.
    push, _pp, _secrets = resources
    client = _client(analyst)

    for text in ("s3cret", "token=s3", "hook?token", "/hook"):
        page = client.get("/console/subscriptions/", {"q": text}).content.decode()
        assert "No subscription matches." in page, text
    by_host = client.get("/console/subscriptions/", {"q": "127.0.0.1:9"}).content.decode()
    assert f"#{resource_tag(str(push.id))}" in by_host


def test_an_analyst_sees_the_subscriptions_a_topic_deletion_kept_by_tag(
    analyst, operator, resources
):  # type: ignore[no-untyped-def]
    # A deletion that keeps its subscriptions names them in its entry; they stay live, and an
    # id acts on an anonymous subscription.
    push, _pp, _secrets = resources
    cascades.topic_delete(
        topic_id=Topic.objects.get(path="Mask:Door").pk, subscriptions="keep", actor=operator
    )
    client = _client(analyst)

    page = client.get("/console/audit/").content.decode()
    api = client.get("/api/v1/audit", {"object_type": "topic"})

    assert "topic.delete" in page
    assert str(push.id) not in page
    assert f"#{resource_tag(str(push.id))}" in page
    assert api.status_code == 200, api.content
    assert str(push.id) not in api.content.decode()
    assert f"#{resource_tag(str(push.id))}" in api.content.decode()
