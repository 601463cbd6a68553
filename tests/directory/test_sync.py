"""The directory and the broker's topics in step, both ways, against the real slapd.

Changes happen under the tests' own root topic (fixture dir_root); the demo tree is only read.
"""

from __future__ import annotations

import time

import pytest

from hpwsn_site import state
from tests.directory.helpers import entry, ldapdelete, ldif, sync_process_stopped, topic_dn
from tests.support import wait_until

pytestmark = pytest.mark.integration


def topic(path: str):  # type: ignore[no-untyped-def]
    from topics.models import Topic

    return Topic.objects.filter(path=path).first()


def add_topic(directory, path: str, extra: str = "") -> None:  # type: ignore[no-untyped-def]
    name = path.rsplit(":", 1)[-1]
    ldif(
        directory,
        f"dn: {topic_dn(path)}\nobjectClass: hpwsnTopic\ncn: {name}\nhpwsnTopicName: {name}\n"
        + extra,
        tool="ldapadd",
    )


def test_it_loads_the_demo_tree_from_the_directory_at_start_up(platform, db_access):
    from directory.models import TopicLink

    assert wait_until(
        lambda: TopicLink.objects.filter(topic__path="ALL:ALARM:ALARM1:ALARM11:ALARM115").exists()
    ), platform.logs()
    assert TopicLink.objects.filter(topic__path="Object:Food:Fruit:Grape").exists()
    # The demo roots allow anonymous callers, as the thesis's demo does.
    assert topic("ALL").anonymous_publish is True
    assert topic("Object").anonymous_subscribe is True


def test_an_ldapmodify_reaches_the_broker_within_5_seconds(
    platform, ldap_directory, db_access, dir_root
):
    path = f"{dir_root}:Probe"
    add_topic(ldap_directory, path)
    assert wait_until(lambda: topic(path) is not None, timeout=5), platform.logs()
    t0 = time.monotonic()
    ldif(
        ldap_directory,
        f"dn: {topic_dn(path)}\nchangetype: modify\nreplace: hpwsnReliability\n"
        "hpwsnReliability: fast\n-\nreplace: hpwsnPriority\nhpwsnPriority: 8\n",
    )
    seen = wait_until(
        lambda: (t := topic(path)) is not None and t.reliability == "fast" and t.priority == 8,
        timeout=5.0,
        interval=0.02,
    )
    elapsed = time.monotonic() - t0
    print(f"ldapmodify -> broker topic: {elapsed * 1000:.0f} ms")
    assert seen, platform.logs()
    ldapdelete(ldap_directory, topic_dn(path))


def test_topics_added_renamed_and_deleted_in_the_directory_follow_in_the_broker(
    platform, ldap_directory, db_access, dir_root
):
    d = ldap_directory
    live1, live2 = f"{dir_root}:LIVE1", f"{dir_root}:LIVE2"
    add_topic(d, live1, "hpwsnOrdered: TRUE\n")
    add_topic(d, f"{live1}:Leaf")
    assert wait_until(lambda: topic(f"{live1}:Leaf") is not None, timeout=5), platform.logs()
    assert topic(live1).ordered is True
    # Rename (modrdn and the name) the parent: the subtree moves with it.
    ldif(
        d,
        f"dn: {topic_dn(live1)}\nchangetype: modrdn\nnewrdn: cn=LIVE2\ndeleteoldrdn: 1\n\n"
        f"dn: {topic_dn(live2)}\nchangetype: modify\nreplace: hpwsnTopicName\n"
        "hpwsnTopicName: LIVE2\n",
    )
    assert wait_until(lambda: topic(f"{live2}:Leaf") is not None, timeout=5), platform.logs()
    assert topic(live1) is None
    ldapdelete(d, topic_dn(f"{live2}:Leaf"), topic_dn(live2))
    assert wait_until(lambda: topic(live2) is None, timeout=5), platform.logs()


def test_a_topic_created_and_edited_in_django_is_written_to_the_directory(
    platform, ldap_directory, db_access, committed, dir_root
):
    from topics.models import Topic
    from topics.services import topic_create

    d = ldap_directory
    path = f"{dir_root}:Cheese"
    committed(topic_create, path=path)
    assert wait_until(lambda: entry(d, topic_dn(path)) is not None, timeout=10)

    def edit() -> None:
        Topic.objects.filter(path=path).update(priority=7, reliability="fast")
        state.bump(state.VERSION_TOPICS)

    committed(edit)
    assert wait_until(
        lambda: (entry(d, topic_dn(path)) or {}).get("hpwsnPriority") == ["7"], timeout=10
    ), platform.logs()
    assert entry(d, topic_dn(path))["hpwsnReliability"] == ["fast"]  # type: ignore[index]
    # Our own write comes back through syncrepl and changes nothing: no ping-pong.
    time.sleep(1.0)
    cheese = topic(path)
    assert (cheese.priority, cheese.reliability) == (7, "fast")

    committed(lambda: Topic.objects.filter(path=path).delete())
    committed(state.bump, state.VERSION_TOPICS)
    assert wait_until(lambda: entry(d, topic_dn(path)) is None, timeout=10)


def test_a_topic_renamed_and_moved_in_django_moves_its_subtree_in_the_directory(
    platform, ldap_directory, db_access, committed, dir_root
):
    from subscriptions.cascades import topic_move, topic_rename
    from topics.models import Topic
    from topics.services import topic_create

    d = ldap_directory
    committed(topic_create, path=f"{dir_root}:Mover:Inner")
    committed(topic_create, path=f"{dir_root}:Shelf")
    assert wait_until(lambda: entry(d, topic_dn(f"{dir_root}:Mover:Inner")) is not None, 10)

    mover = Topic.objects.get(path=f"{dir_root}:Mover")
    committed(topic_rename, topic_id=mover.pk, name="Moved")
    assert wait_until(
        lambda: entry(d, topic_dn(f"{dir_root}:Moved:Inner")) is not None, timeout=10
    ), platform.logs()
    assert entry(d, topic_dn(f"{dir_root}:Mover")) is None
    assert entry(d, topic_dn(f"{dir_root}:Moved"))["hpwsnTopicName"] == ["Moved"]  # type: ignore[index]

    shelf = Topic.objects.get(path=f"{dir_root}:Shelf")
    committed(topic_move, topic_id=mover.pk, parent_id=shelf.pk)
    assert wait_until(
        lambda: entry(d, topic_dn(f"{dir_root}:Shelf:Moved:Inner")) is not None, timeout=10
    ), platform.logs()
    assert entry(d, topic_dn(f"{dir_root}:Moved")) is None
    # The directory's echo of the move changes nothing in the broker.
    time.sleep(1.0)
    assert topic(f"{dir_root}:Shelf:Moved:Inner") is not None
    assert topic(f"{dir_root}:Moved") is None


def test_changes_made_while_the_sync_process_was_stopped_are_loaded_when_it_starts(
    platform, ldap_directory, db_access, dir_root
):
    d = ldap_directory
    add_topic(d, f"{dir_root}:Doomed")
    add_topic(d, f"{dir_root}:Edited")
    assert wait_until(lambda: topic(f"{dir_root}:Edited") is not None, timeout=5)
    with sync_process_stopped(platform):
        add_topic(d, f"{dir_root}:Offline", "hpwsnTtlSeconds: 60\n")
        ldif(
            d,
            f"dn: {topic_dn(f'{dir_root}:Edited')}\nchangetype: modify\nreplace: description\n"
            "description: changed while the broker was away\n",
        )
        ldapdelete(d, topic_dn(f"{dir_root}:Doomed"))
        time.sleep(0.5)
        assert topic(f"{dir_root}:Offline") is None
    assert wait_until(lambda: topic(f"{dir_root}:Doomed") is None, timeout=10), platform.logs()
    assert topic(f"{dir_root}:Offline").ttl_seconds == 60
    assert topic(f"{dir_root}:Edited").description == "changed while the broker was away"
