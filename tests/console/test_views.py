"""The console pages through Django's test client: roles, forms, actions and the audit log."""

from __future__ import annotations

import pytest
from django.test import Client

from audit.models import AuditEntry
from subscriptions.models import Subscription
from tests.console.conftest import PASSWORD, add_subscription
from topics.models import Topic
from topics.services import topic_create

pytestmark = pytest.mark.django_db
LOCAL = "django.contrib.auth.backends.ModelBackend"


def _client(user) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(user, backend=LOCAL)
    return client


@pytest.fixture
def tree(db):  # type: ignore[no-untyped-def]
    topic_create(path="Plant:Boiler:Temp")
    topic_create(path="Plant:Pump")
    return Topic.objects.get(path="Plant:Boiler")


def test_an_anonymous_visitor_is_sent_to_the_login_page():
    res = Client().get("/console/subscriptions/")

    assert res.status_code == 302
    assert res.url.startswith("/console/login/?next=/console/subscriptions/")


def test_a_user_without_a_console_role_is_forbidden(outsider, tree):
    client = _client(outsider)

    for url in ("/console/", f"/console/topics/{tree.pk}/", "/console/audit/"):
        res = client.get(url)
        assert res.status_code == 403
        assert b"is in none of the console's directory groups" in res.content


def test_an_analyst_reads_every_page_but_changes_nothing(analyst, tree):
    client = _client(analyst)
    sub = add_subscription("Plant:Boiler")

    for url in (
        "/console/",
        f"/console/topics/{tree.pk}/",
        "/console/subscriptions/",
        "/console/pullpoints/",
        "/console/audit/",
    ):
        res = client.get(url)
        assert res.status_code == 200, url
        assert b"read-only" in res.content
    page = client.get(f"/console/topics/{tree.pk}/").content.decode()
    assert "<fieldset disabled>" in page
    assert 'id="policy-save"' not in page

    assert client.post(f"/console/topics/{tree.pk}/", {"priority": "1"}).status_code == 403
    assert client.post(f"/console/topics/{tree.pk}/rename/", {"name": "X"}).status_code == 403
    assert client.get(f"/console/topics/{tree.pk}/delete/").status_code == 403
    assert client.get("/console/topics/new/").status_code == 403
    assert client.post(f"/console/subscriptions/{sub.id}/pause/").status_code == 403
    tree.refresh_from_db()
    sub.refresh_from_db()
    assert tree.priority is None
    assert tree.path == "Plant:Boiler"
    assert sub.state == "active"
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize("who", ["operator", "admin_user"])
def test_operators_and_admins_edit_a_policy_and_the_change_is_audited(who, request, tree):
    user = request.getfixturevalue(who)

    res = _client(user).post(
        f"/console/topics/{tree.pk}/",
        {"reliability": "fast", "ordered": "false", "priority": "8", "retry_schedule": "1,2"},
    )

    assert res.status_code == 302
    tree.refresh_from_db()
    assert (tree.reliability, tree.ordered, tree.priority, tree.retry_schedule) == (
        "fast",
        False,
        8,
        "1,2",
    )
    entry = AuditEntry.objects.get(action="topic.update")
    assert entry.actor == user.username
    assert entry.before["priority"] is None
    assert entry.after["priority"] == 8


def test_a_bad_policy_value_is_shown_next_to_its_field(operator, tree):
    res = _client(operator).post(
        f"/console/topics/{tree.pk}/", {"priority": "42", "retry_schedule": "5,x"}
    )

    assert res.status_code == 400
    page = res.content.decode()
    assert 'data-field="priority"' in page
    assert "0 to 9" in page
    assert 'data-field="retry_schedule"' in page
    assert "&#x27;x&#x27; is not a number" in page
    tree.refresh_from_db()
    assert tree.priority is None


def test_the_policy_form_shows_inherited_values_as_placeholders(operator, tree):
    plant = Topic.objects.get(path="Plant")
    plant.ttl_seconds = 90
    plant.save(update_fields=["ttl_seconds"])

    page = _client(operator).get(f"/console/topics/{tree.pk}/").content.decode()

    assert 'placeholder="90 (from Plant)"' in page
    assert "inherit: reliable (from default)" in page


def test_the_tree_counts_subscriptions_of_each_subtree(operator, tree):
    add_subscription("Plant:Boiler")
    add_subscription("Plant:Boiler:Temp")
    add_subscription("Plant:Pump")

    page = _client(operator).get("/console/").content.decode()

    def count(path: str) -> str:
        node = page.split(f'data-path="{path}"', 1)[1]
        return node.split('class="count subs"', 1)[1].split("data-value=", 1)[1].split('"')[1]

    assert count("Plant") == "3"
    assert count("Plant:Boiler") == "2"
    assert count("Plant:Boiler:Temp") == "1"
    assert count("Plant:Pump") == "1"


def test_an_operator_creates_renames_and_moves_topics(operator, tree):
    client = _client(operator)

    res = client.post("/console/topics/new/", {"path": "Plant:Boiler:Pressure"})
    assert res.status_code == 302
    invalid = client.post("/console/topics/new/", {"path": "Plant:bad name"})
    assert b"is not a valid topic name" in invalid.content
    again = client.post("/console/topics/new/", {"path": "Plant:Boiler:Pressure"})
    assert again.status_code == 200
    assert b"already exists" in again.content

    assert client.post(f"/console/topics/{tree.pk}/rename/", {"name": "Heater"}).status_code == 302
    assert set(
        Topic.objects.filter(path__startswith="Plant:Heater").values_list("path", flat=True)
    ) == {
        "Plant:Heater",
        "Plant:Heater:Temp",
        "Plant:Heater:Pressure",
    }
    pump = Topic.objects.get(path="Plant:Pump")
    res = client.post(f"/console/topics/{tree.pk}/move/", {"parent": "Plant:Pump"})
    assert res.status_code == 302
    assert Topic.objects.filter(path="Plant:Pump:Heater:Temp").exists()

    bad = client.post(f"/console/topics/{pump.pk}/move/", {"parent": "Plant:Pump:Heater"})
    assert bad.status_code == 400
    assert b"cannot move under itself" in bad.content
    nowhere = client.post(f"/console/topics/{pump.pk}/move/", {"parent": "No:Such"})
    assert nowhere.status_code == 400
    assert b"there is no topic &#x27;No:Such&#x27;" in nowhere.content
    assert client.post(f"/console/topics/{pump.pk}/move/", {"parent": ""}).status_code == 302
    assert Topic.objects.filter(path="Pump:Heater:Temp").exists()
    actions = list(AuditEntry.objects.order_by("id").values_list("action", flat=True))
    assert actions == ["topic.create", "topic.rename", "topic.move", "topic.move"]


def test_the_delete_page_counts_what_goes_and_asks_about_subscriptions(operator, tree):
    client = _client(operator)
    subs = [add_subscription("Plant:Boiler"), add_subscription("Plant:Boiler:Temp")]
    other = add_subscription("Plant:Pump")

    page = client.get(f"/console/topics/{tree.pk}/delete/").content.decode()
    assert 'id="delete-topic-count">2<' in page
    assert 'id="delete-sub-count">2<' in page
    assert client.post(f"/console/topics/{tree.pk}/delete/", {}).status_code == 200  # no choice

    res = client.post(f"/console/topics/{tree.pk}/delete/", {"subscriptions": "delete"})

    assert res.status_code == 302
    assert not Topic.objects.filter(path__startswith="Plant:Boiler").exists()
    assert not Subscription.objects.filter(id__in=[s.id for s in subs]).exists()
    assert Subscription.objects.filter(id=other.id).exists()


def test_an_operator_pauses_resumes_renews_and_removes_a_subscription(operator, tree):
    client = _client(operator)
    sub = add_subscription("Plant:Boiler")
    base = f"/console/subscriptions/{sub.id}"

    assert client.post(f"{base}/pause/").status_code == 302
    sub.refresh_from_db()
    assert sub.state == "paused"
    assert client.post(f"{base}/resume/").status_code == 302
    sub.refresh_from_db()
    assert sub.state == "active"
    assert client.post(f"{base}/renew/", {"termination_time": "P2D"}).status_code == 302
    sub.refresh_from_db()
    assert sub.termination_time is not None
    bad = client.post(f"{base}/renew/", {"termination_time": "yesterday"}, follow=True)
    assert b"is not an xsd:dateTime" in bad.content
    assert client.post(f"{base}/remove/").status_code == 302
    assert not Subscription.objects.filter(id=sub.id).exists()

    entries = AuditEntry.objects.filter(object_id=str(sub.id)).order_by("id")
    assert [e.action for e in entries] == [
        "subscription.pause",
        "subscription.resume",
        "subscription.renew",
        "subscription.remove",
    ]
    assert (entries[0].before["state"], entries[0].after["state"]) == ("active", "paused")
    assert entries[2].before["termination_time"] is None
    assert entries[2].after["termination_time"] is not None
    assert entries[3].after is None


def test_the_subscription_list_filters_by_state_and_subtree(operator, tree):
    paused = add_subscription("Plant:Boiler:Temp", state="paused")
    active = add_subscription("Plant:Pump")
    client = _client(operator)

    by_state = client.get("/console/subscriptions/", {"state": "paused"}).content.decode()
    by_topic = client.get("/console/subscriptions/", {"topic": "Plant:Pump"}).content.decode()

    assert str(paused.id) in by_state
    assert str(active.id) not in by_state
    assert str(active.id) in by_topic
    assert str(paused.id) not in by_topic


def test_an_operator_destroys_a_pull_point_and_its_subscriptions(operator):
    from subscriptions.services import pull_point_create

    pp = pull_point_create(base_url="http://testserver")
    sub = add_subscription("", mode="pull", pull_point=pp)
    client = _client(operator)
    assert str(pp.id) in client.get("/console/pullpoints/").content.decode()

    res = client.post(f"/console/pullpoints/{pp.id}/remove/")

    assert res.status_code == 302
    pp.refresh_from_db()
    assert pp.destroyed_at is not None
    assert not Subscription.objects.filter(id=sub.id).exists()
    entry = AuditEntry.objects.get(action="pullpoint.remove")
    assert entry.before["subscriptions"] == [str(sub.id)]


def test_pull_points_and_pull_subscriptions_show_when_they_were_last_read(operator):
    from datetime import UTC, datetime

    from console.selectors import subscription_rows
    from subscriptions.models import PullPoint
    from subscriptions.services import pull_point_create

    pp = pull_point_create(base_url="http://testserver")
    sub = add_subscription("", mode="pull", pull_point=pp)
    client = _client(operator)
    assert "never" in client.get("/console/pullpoints/").content.decode()
    assert subscription_rows(subs=[sub])[0].last_delivery is None

    read = datetime(2026, 11, 20, 8, 30, tzinfo=UTC)
    PullPoint.objects.filter(id=pp.id).update(last_used_at=read)
    sub.refresh_from_db()

    assert "2026-11-20 08:30" in client.get("/console/pullpoints/").content.decode()
    assert subscription_rows(subs=[sub])[0].last_delivery == read


def test_a_topics_page_lists_its_own_changes_under_every_path_it_had(operator, tree):
    from subscriptions.cascades import topic_rename
    from topics.services import topic_update

    temp = Topic.objects.get(path="Plant:Boiler:Temp")
    topic_update(topic_id=tree.pk, changes={"priority": 7}, actor=operator)
    topic_rename(topic_id=tree.pk, name="Furnace", actor=operator)
    topic_update(topic_id=temp.pk, changes={"priority": 2}, actor=operator)

    res = _client(operator).get(f"/console/topics/{tree.pk}/")

    # Its update (made as Plant:Boiler) and its rename; not Plant:Furnace:Temp's update.
    shown = [(e.action, e.object_id) for e in res.context["recent_audit"]]
    assert shown == [("topic.rename", "Plant:Boiler"), ("topic.update", "Plant:Boiler")]


def test_the_audit_page_filters_by_who_and_by_object(operator, admin_user, tree):
    pump = Topic.objects.get(path="Plant:Pump")
    _client(operator).post(f"/console/topics/{tree.pk}/", {"priority": "1"})
    _client(admin_user).post(f"/console/topics/{pump.pk}/", {"priority": "2"})
    client = _client(operator)

    mine = client.get("/console/audit/", {"who": "console-operator"}).content.decode()
    pumps = client.get("/console/audit/", {"object": "Pump"}).content.decode()

    assert "Plant:Boiler" in mine
    assert "Plant:Pump" not in mine
    assert "Plant:Pump" in pumps
    assert "Plant:Boiler<" not in pumps


def test_forms_without_the_csrf_token_are_refused(operator, tree):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator, backend=LOCAL)

    res = client.post(f"/console/topics/{tree.pk}/", {"priority": "1"})

    assert res.status_code == 403
    tree.refresh_from_db()
    assert tree.priority is None


def test_the_login_page_says_when_the_credentials_are_wrong(operator):
    client = Client()

    wrong = client.post("/console/login/", {"username": operator.username, "password": "nope"})
    right = client.post("/console/login/", {"username": operator.username, "password": PASSWORD})

    assert wrong.status_code == 200
    assert b'id="login-error"' in wrong.content
    assert right.status_code == 302
    assert right.url == "/console/"


def test_an_operator_redrives_a_dead_letter_back_into_its_queue(operator, analyst, tree):
    from console.selectors import subscription_rows
    from dispatch.models import DeadLetter

    sub = add_subscription("Plant:Boiler")
    letter = DeadLetter.objects.create(
        subscription_id=str(sub.id),
        consumer_address=sub.consumer_address,
        notification_id="n-console-1",
        topic="Plant:Boiler",
        message=b"<m/>",
        reason="exhausted",
        attempts=[{"time": 0, "status": 503, "detail": "unavailable", "duration_ms": 1}],
    )
    page = _client(analyst).get("/console/deadletters/", {"subscription": str(sub.id)})
    assert "unavailable" in page.content.decode()
    refused = _client(analyst).post("/console/deadletters/redrive/", {"id": [letter.id]})
    assert refused.status_code == 403

    res = _client(operator).post("/console/deadletters/redrive/", {"id": [letter.id]})

    assert res.status_code == 302
    # Queued again, and kept (marked) until its consumer has taken it.
    assert DeadLetter.objects.get(id=letter.id).redriven_at is not None
    [row] = subscription_rows(subs=[sub])
    assert (row.queued, row.dead_letters) == (1, 0)
    entry = AuditEntry.objects.get(action="deadletter.redrive")
    assert entry.after == {"redriven": 1, "left": 0}


def test_an_action_returns_to_a_page_of_this_site_only(operator, tree):
    sub = add_subscription("Plant:Boiler")
    client = _client(operator)

    inside = client.post(
        f"/console/subscriptions/{sub.id}/pause/", {"next": "/console/subscriptions/?state=paused"}
    )
    outside = client.post(
        f"/console/subscriptions/{sub.id}/resume/", {"next": "//evil.example/console/"}
    )

    assert inside.url == "/console/subscriptions/?state=paused"
    assert outside.url == "/console/subscriptions/"


def test_operators_see_registered_publishers_their_owners_and_demand_state(operator):
    from subscriptions.models import PublisherRegistration

    PublisherRegistration.objects.create(
        publisher_address="http://sensor-7.example/wsn",
        topic_paths=["Plant:Boiler"],
        owner="user:publisher1",
    )
    PublisherRegistration.objects.create(
        publisher_address="http://meter.example/wsn",
        topic_paths=["Plant:Meter"],
        demand=True,
        demand_state={"Plant:Meter": {"address": "http://meter.example/s/1", "paused": True}},
    )
    client = _client(operator)

    page = client.get("/console/registrations/").content.decode()
    assert "http://sensor-7.example/wsn" in page
    assert "Plant:Boiler" in page
    assert "Plant:Meter: paused" in page
    assert '<td class="owner">publisher1</td>' in page
    assert '<td class="owner">anonymous</td>' in page

    found = client.get("/console/registrations/?q=meter").content.decode()
    assert "http://meter.example/wsn" in found
    assert "sensor-7" not in found

    by_owner = client.get("/console/registrations/?q=publisher1").content.decode()
    assert "http://sensor-7.example/wsn" in by_owner
    assert "meter.example" not in by_owner


def test_the_peers_page_shows_each_peer_site_up_or_down_with_its_links(analyst, settings):
    import json
    import time

    from federation.peers import Peer
    from hpwsn_site import state

    settings.HPWSN_FEDERATION_PEERS = [
        Peer("b", "http://10.0.0.2:8000"),
        Peer("c", "http://10.0.0.3:8000"),
    ]
    r = state.get_redis()
    r.hset(
        state.FEDERATION_PEERS,
        mapping={
            "b": json.dumps({"last_ok": time.time() - 2, "links": ["ALL:ALARM"], "last_error": ""}),
            "c": json.dumps({"last_error": "http://10.0.0.3:8000/wsn/: ConnectError()"}),
        },
    )
    try:
        page = _client(analyst).get("/console/peers/").content.decode()
    finally:
        r.delete(state.FEDERATION_PEERS)

    b = page[page.index('data-peer="b"') :].split("</tr>")[0]
    c = page[page.index('data-peer="c"') :].split("</tr>")[0]
    assert '<td class="state up">up</td>' in b
    assert "ALL:ALARM" in b
    assert "s ago" in b
    assert '<td class="state down">down</td>' in c
    assert "never" in c
    assert "ConnectError" in c


def test_the_peers_page_says_when_the_site_has_none(analyst, settings):
    settings.HPWSN_FEDERATION_PEERS = []
    page = _client(analyst).get("/console/peers/").content.decode()
    assert "This site has no federation peers." in page
