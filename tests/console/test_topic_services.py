"""Topic services as operators use them: policy edits, rename, move, delete, audit, reload."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection

from audit.models import AuditEntry
from directory.models import TopicLink
from hpwsn_site import state
from subscriptions import cascades
from subscriptions.models import Subscription
from tests.console.conftest import add_subscription
from tests.topics import test_changes
from topics import services
from topics.models import Topic

pytestmark = pytest.mark.django_db

# The tree's own change markers: an earlier test's rolled-back entries, left in Redis's copy of the
# change log by its wake-ups, are not taken for this test's entries of the same numbers.
own_markers = test_changes.own_markers


def _topic(path: str) -> Topic:
    return services.topic_create(path=path)


def test_an_update_sets_the_policy_and_records_who_and_before_after(operator):
    topic = _topic("Plant:Boiler")

    services.topic_update(
        topic_id=topic.pk,
        changes={
            "reliability": "fast",
            "priority": "7",
            "retry_schedule": " 0, 2.5 ,60",
            "ttl_seconds": 30,
            "auto_create_children": "true",
            "description": "boiler alarms",
        },
        actor=operator,
    )

    topic.refresh_from_db()
    assert topic.reliability == "fast"
    assert topic.priority == 7
    assert topic.retry_schedule == "0,2.5,60"
    assert topic.ttl_seconds == 30
    assert topic.auto_create_children is True
    entry = AuditEntry.objects.get(action="topic.update")
    assert entry.actor == "console-operator"
    assert entry.object_id == "Plant:Boiler"
    assert entry.before["reliability"] == ""
    assert entry.after["reliability"] == "fast"
    assert entry.before["priority"] is None
    assert entry.after["priority"] == 7
    assert {k for k, _old, _new in entry.changes} == {
        "reliability",
        "priority",
        "retry_schedule",
        "ttl_seconds",
        "auto_create_children",
        "description",
    }


def test_empty_values_clear_the_own_policy_so_the_topic_inherits_again(operator):
    topic = _topic("Plant:Pump")
    services.topic_update(topic_id=topic.pk, changes={"priority": 9, "ordered": False})

    services.topic_update(topic_id=topic.pk, changes={"priority": "", "ordered": ""})

    topic.refresh_from_db()
    assert topic.priority is None
    assert topic.ordered is None


def test_bad_policy_values_are_refused_field_by_field_and_nothing_changes(operator):
    topic = _topic("Plant:Valve")

    with pytest.raises(ValidationError) as caught:
        services.topic_update(
            topic_id=topic.pk,
            changes={
                "reliability": "slow",
                "priority": 12,
                "retry_schedule": "1,-2",
                "fragment_size": 2,
                "ttl_seconds": "soon",
                "ordered": "maybe",
                "colour": "red",
            },
            actor=operator,
        )

    errors = caught.value.message_dict
    assert set(errors) == {
        "reliability",
        "priority",
        "retry_schedule",
        "fragment_size",
        "ttl_seconds",
        "ordered",
        "colour",
    }
    assert "'reliable' or 'fast'" in errors["reliability"][0]
    assert "0 to 9" in errors["priority"][0]
    assert "'-2'" in errors["retry_schedule"][0]
    topic.refresh_from_db()
    assert topic.reliability == ""
    assert topic.priority is None
    assert not AuditEntry.objects.exists()


def test_only_a_root_topic_takes_a_namespace():
    child = _topic("Plant:Tank")
    root = Topic.objects.get(path="Plant")

    with pytest.raises(ValidationError) as caught:
        services.topic_update(topic_id=child.pk, changes={"namespace": "urn:plant"})
    services.topic_update(topic_id=root.pk, changes={"namespace": "urn:plant"})

    assert "root" in caught.value.message_dict["namespace"][0]
    root.refresh_from_db()
    assert root.namespace == "urn:plant"


def test_an_update_that_changes_nothing_records_nothing(operator):
    topic = _topic("Plant:Fan")
    services.topic_update(topic_id=topic.pk, changes={"priority": 3}, actor=operator)

    services.topic_update(topic_id=topic.pk, changes={"priority": "3"}, actor=operator)

    assert AuditEntry.objects.filter(action="topic.update").count() == 1


def test_access_groups_are_normalised_and_checked():
    topic = _topic("Plant:Door")

    services.topic_update(
        topic_id=topic.pk,
        changes={"publish_groups": " ops , hpwsn-operators,ops", "anonymous_subscribe": True},
    )
    with pytest.raises(ValidationError) as caught:
        services.topic_update(topic_id=topic.pk, changes={"subscribe_groups": "ops,(cn=*)"})

    topic.refresh_from_db()
    assert topic.publish_groups == "ops,hpwsn-operators"
    assert topic.anonymous_subscribe is True
    assert "(cn=*)" in caught.value.message_dict["subscribe_groups"][0]


def test_renaming_a_topic_rewrites_its_subtree_and_its_subscriptions(operator):
    _topic("Site:Hall:Light:Lamp1")
    _topic("Site:Hall:Door")
    _topic("Site:Hallway")  # a sibling whose name starts the same must not move
    hall = Topic.objects.get(path="Site:Hall")
    on_lamp = add_subscription("Site:Hall:Light:Lamp1")
    on_hallway = add_subscription("Site:Hallway")

    cascades.topic_rename(topic_id=hall.pk, name="Lobby", actor=operator)

    paths = set(Topic.objects.filter(path__startswith="Site").values_list("path", flat=True))
    assert paths == {
        "Site",
        "Site:Lobby",
        "Site:Lobby:Light",
        "Site:Lobby:Light:Lamp1",
        "Site:Lobby:Door",
        "Site:Hallway",
    }
    on_lamp.refresh_from_db()
    on_hallway.refresh_from_db()
    assert on_lamp.topic_path == "Site:Lobby:Light:Lamp1"
    assert on_hallway.topic_path == "Site:Hallway"
    entry = AuditEntry.objects.get(action="topic.rename")
    assert entry.object_id == "Site:Hall"
    assert (entry.before["path"], entry.after["path"]) == ("Site:Hall", "Site:Lobby")
    assert entry.after["descendants"] == 3
    assert entry.after["subscriptions"] == 1


def test_a_subscription_that_followed_a_rename_matches_the_new_path():
    from hpwsn import topicexpr

    _topic("Site:Gate:Bell")
    gate = Topic.objects.get(path="Site:Gate")
    sub = add_subscription("Site:Gate:Bell")

    cascades.topic_rename(topic_id=gate.pk, name="Portal")

    sub.refresh_from_db()
    expr = topicexpr.parse(sub.topic_expression, sub.topic_dialect, sub.topic_nsmap)
    assert expr.covers(None, ("Site", "Portal", "Bell"))
    assert not expr.covers(None, ("Site", "Gate", "Bell"))


def test_an_identical_subscribe_after_a_rename_finds_the_subscription_that_followed(
    own_markers: None, django_capture_on_commit_callbacks
):
    """Also with a content filter sent without a Dialect (stored as XPath 1.0)."""
    from hpwsn.wsn import TopicRef
    from subscriptions.services import subscription_create
    from topics.acl import Principal

    def subscribe(path: str) -> tuple[Subscription, bool]:
        return subscription_create(
            consumer_address="http://127.0.0.1:9/bell",
            topic=TopicRef(text=path, dialect=None, nsmap={}),
            content=TopicRef(text="/ring", dialect=None, nsmap={}),
            initial_termination_time=None,
            soap_version="1.1",
            use_raw=False,
            base_url="http://testserver",
            principal=Principal(name="admin1", groups=frozenset({"hpwsn-admins"})),
        )

    _topic("Site:Door:Bell")
    sub, created = subscribe("Site:Door:Bell")
    assert created
    assert subscribe("Site:Door:Bell") == (sub, False)

    with django_capture_on_commit_callbacks(execute=True):  # the tree reloads on commit
        cascades.topic_rename(topic_id=Topic.objects.get(path="Site:Door").pk, name="Porch")

    assert subscribe("Site:Porch:Bell") == (sub, False)
    assert Subscription.objects.filter(consumer_address="http://127.0.0.1:9/bell").count() == 1


def test_a_peer_sites_link_to_a_renamed_topic_is_found_again_by_its_next_identical_subscribe(
    own_markers: None, django_capture_on_commit_callbacks
):
    """A link carries its interest path and SigningSecret in its dedup key: after a rename, the
    peer's next round (same path, same secret, the new name) finds the link that followed instead
    of making a second one, which would deliver every notification twice to that site."""
    from hpwsn.wsn import TopicRef
    from subscriptions.services import subscription_create
    from topics.acl import Principal

    def link(path: str) -> tuple[Subscription, bool]:
        return subscription_create(
            consumer_address="http://127.0.0.1:9/federation/in/",
            topic=TopicRef(text=path, dialect=None, nsmap={}),
            content=None,
            initial_termination_time=None,
            soap_version="1.1",
            use_raw=False,
            base_url="http://testserver",
            principal=Principal(name="site-b", groups=frozenset({"hpwsn-admins"})),
            interest_path=["b"],
            signing_secret="a secret of the link a-b",
        )

    _topic("Yard:Gate:Bell")
    sub, created = link("Yard:Gate:Bell")
    assert created

    with django_capture_on_commit_callbacks(execute=True):
        cascades.topic_rename(topic_id=Topic.objects.get(path="Yard:Gate").pk, name="Door")

    assert link("Yard:Door:Bell") == (sub, False)
    assert Subscription.objects.filter(consumer_address__contains="/federation/in/").count() == 1


def test_moving_a_topic_hangs_its_subtree_under_the_new_parent(operator):
    _topic("Farm:Barn:Cow")
    _topic("Farm:Field")
    barn = Topic.objects.get(path="Farm:Barn")
    field = Topic.objects.get(path="Farm:Field")

    cascades.topic_move(topic_id=barn.pk, parent_id=field.pk, actor=operator)
    barn.refresh_from_db()
    assert barn.path == "Farm:Field:Barn"
    assert barn.parent_id == field.pk
    assert Topic.objects.filter(path="Farm:Field:Barn:Cow").exists()

    cascades.topic_move(topic_id=barn.pk, parent_id=None, actor=operator)
    barn.refresh_from_db()
    assert barn.path == "Barn"
    assert barn.parent_id is None
    assert Topic.objects.filter(path="Barn:Cow").exists()
    assert AuditEntry.objects.filter(action="topic.move").count() == 2


def test_a_topic_cannot_move_under_itself_or_its_descendants():
    _topic("Zoo:Cage:Lion")
    cage = Topic.objects.get(path="Zoo:Cage")
    lion = Topic.objects.get(path="Zoo:Cage:Lion")

    for target in (cage, lion):
        with pytest.raises(ValidationError) as caught:
            cascades.topic_move(topic_id=cage.pk, parent_id=target.pk)
        assert "descendants" in caught.value.message_dict["parent"][0]
    assert Topic.objects.filter(path="Zoo:Cage:Lion").exists()


def test_a_topic_cannot_move_where_its_subtree_would_be_deeper_than_16_levels():
    deep = ":".join(f"L{n}" for n in range(1, 16))  # 15 levels
    _topic(deep)
    _topic("Crate:Box")
    crate = Topic.objects.get(path="Crate")
    level_14 = Topic.objects.get(path=deep.rsplit(":", 1)[0])
    level_15 = Topic.objects.get(path=deep)

    # Under the 15th level, Crate:Box would be the 17th.
    with pytest.raises(ValidationError) as caught:
        cascades.topic_move(topic_id=crate.pk, parent_id=level_15.pk)

    assert "deeper than 16 levels" in caught.value.message_dict["parent"][0]
    assert set(Topic.objects.filter(name__in=("Crate", "Box")).values_list("path", flat=True)) == {
        "Crate",
        "Crate:Box",
    }
    # Under the 14th, its Box is the 16th: allowed.
    cascades.topic_move(topic_id=crate.pk, parent_id=level_14.pk)
    assert Topic.objects.filter(path=f"{level_14.path}:Crate:Box").exists()


def test_a_rename_or_move_onto_an_existing_name_is_refused():
    _topic("Lab:A:X")
    _topic("Lab:B:X")
    a = Topic.objects.get(path="Lab:A")
    ax = Topic.objects.get(path="Lab:A:X")
    b = Topic.objects.get(path="Lab:B")

    with pytest.raises(ValidationError) as renamed:
        cascades.topic_rename(topic_id=a.pk, name="B")
    with pytest.raises(ValidationError) as moved:
        cascades.topic_move(topic_id=ax.pk, parent_id=b.pk)
    with pytest.raises(ValidationError) as bad_name:
        cascades.topic_rename(topic_id=a.pk, name="C:D")

    assert "already exists" in renamed.value.message_dict["name"][0]
    assert "already exists" in moved.value.message_dict["name"][0]
    assert "not a single topic name" in bad_name.value.message_dict["name"][0]
    assert Topic.objects.filter(path="Lab:A:X").exists()


def test_deleting_a_topic_can_keep_the_subscriptions_below_it(operator):
    _topic("Old:Feed:Item")
    feed = Topic.objects.get(path="Old:Feed")
    kept = [add_subscription("Old:Feed"), add_subscription("Old:Feed:Item")]
    elsewhere = add_subscription("Old")

    result = cascades.topic_delete(topic_id=feed.pk, subscriptions="keep", actor=operator)

    assert (result.topics, result.subscriptions_kept, result.subscriptions_deleted) == (2, 2, 0)
    assert not Topic.objects.filter(path__startswith="Old:").exists()
    assert Subscription.objects.filter(id__in=[s.id for s in [*kept, elsewhere]]).count() == 3
    entry = AuditEntry.objects.get(action="topic.delete")
    assert entry.before["subtree"] == ["Old:Feed", "Old:Feed:Item"]
    assert entry.after["subscriptions"] == "keep"


def test_deleting_a_topic_can_unsubscribe_the_subscriptions_below_it(
    operator, django_capture_on_commit_callbacks
):
    _topic("Gone:Feed:Item")
    feed = Topic.objects.get(path="Gone:Feed")
    below = [add_subscription("Gone:Feed"), add_subscription("Gone:Feed:Item")]
    elsewhere = add_subscription("Gone")
    r = state.get_redis()
    r.rpush(state.attempts_key(str(below[0].id)), b"{}")

    with django_capture_on_commit_callbacks(execute=True):
        result = cascades.topic_delete(topic_id=feed.pk, subscriptions="delete", actor=operator)

    assert (result.topics, result.subscriptions_deleted) == (2, 2)
    assert not Subscription.objects.filter(id__in=[s.id for s in below]).exists()
    assert Subscription.objects.filter(id=elsewhere.id).exists()
    assert not r.exists(state.attempts_key(str(below[0].id)))
    assert AuditEntry.objects.get(action="topic.delete").after["subscriptions_deleted"] == 2


@pytest.mark.django_db(transaction=True)
def test_a_topic_delete_that_fails_leaves_its_subscriptions_queues_in_place(operator, monkeypatch):
    # The subscriptions' Redis state went as each was unsubscribed, inside the delete's
    # transaction: when a later step failed, the rows came back and their queues did not.
    _topic("Fail:Feed")
    feed = Topic.objects.get(path="Fail:Feed")
    sub = add_subscription("Fail:Feed")
    sid = str(sub.id)
    r = state.get_redis()
    r.rpush(state.queue_key(sid), b"n1", b"n2")
    r.rpush(state.attempts_key(sid), b"{}")

    def refused(**_kw):  # type: ignore[no-untyped-def]
        raise RuntimeError("the audit log is unavailable")

    monkeypatch.setattr(cascades, "audit_record", refused)
    with pytest.raises(RuntimeError):
        cascades.topic_delete(topic_id=feed.pk, subscriptions="delete", actor=operator)

    assert Subscription.objects.filter(id=sub.id).exists()
    assert Topic.objects.filter(pk=feed.pk).exists()
    assert r.lrange(state.queue_key(sid), 0, -1) == [b"n1", b"n2"]
    assert r.llen(state.attempts_key(sid)) == 1


@pytest.mark.django_db(transaction=True)
def test_a_directory_link_written_while_a_topic_is_deleted_does_not_fail_the_delete():
    # The directory push links a topic to its entry on its own connection, at any moment: here
    # just after Django has detached the links it found, before it deletes the rows.
    _topic("Racing:Feed")
    feed = Topic.objects.get(path="Racing:Feed")
    outcome: dict[str, str] = {}

    def link() -> None:
        try:
            TopicLink.objects.create(topic=feed, entry_uuid=str(uuid.uuid4()), dn="cn=Feed")
            outcome["link"] = "written"
        except IntegrityError:
            outcome["link"] = "refused: the topic is gone"
        finally:
            connection.close()

    pusher = threading.Thread(target=link)

    def between_detach_and_delete(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        result = execute(sql, params, many, context)
        if sql.startswith('UPDATE "directory_topiclink"') and not pusher.is_alive():
            pusher.start()
            pusher.join(1.0)  # done, or waiting for the delete to end
        return result

    with connection.execute_wrapper(between_detach_and_delete):
        result = cascades.topic_delete(
            topic_id=Topic.objects.get(path="Racing").pk, subscriptions="keep"
        )
    pusher.join(10)

    assert result.topics == 2
    assert not Topic.objects.filter(path__startswith="Racing").exists()
    assert outcome["link"] == "refused: the topic is gone"
    assert not TopicLink.objects.exclude(topic=None).filter(dn="cn=Feed").exists()


def test_every_write_announces_a_topic_change_on_commit(
    operator, django_capture_on_commit_callbacks
):
    r = state.get_redis()

    def version() -> int:
        return int(r.get(state.TOPIC_CHANGES) or 0)

    with django_capture_on_commit_callbacks(execute=True):
        topic = services.topic_create(path="Ver:One", actor=operator)
    steps = [
        lambda: services.topic_update(topic_id=topic.pk, changes={"priority": 1}),
        lambda: cascades.topic_rename(topic_id=topic.pk, name="Two"),
        lambda: cascades.topic_move(topic_id=topic.pk, parent_id=None),
        lambda: cascades.topic_delete(topic_id=topic.pk, subscriptions="keep"),
    ]
    for step in steps:
        before = version()
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            step()
        assert version() == before  # nothing is announced before the commit
        for callback in callbacks:
            callback()
        assert version() > before


def test_creating_a_path_audits_every_topic_it_adds(operator):
    _topic("New")

    services.topic_create(path="New:Deep:Leaf", actor=operator)

    created = AuditEntry.objects.filter(action="topic.create").order_by("id")
    assert [e.object_id for e in created] == ["New:Deep", "New:Deep:Leaf"]
    assert all(e.before is None and e.after["path"] == e.object_id for e in created)
