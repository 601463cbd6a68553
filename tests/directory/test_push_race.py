"""The directory push and a topic deleted in Django while the push adds its entry."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from directory import services
from directory.models import TopicLink
from directory.slapdctl import Instance
from tests.directory.helpers import entry, sites_running, topic_dn
from tests.support import free_port

pytestmark = pytest.mark.integration


@pytest.fixture
def directory(tmp_path, settings) -> Iterator[Instance]:  # type: ignore[no-untyped-def]
    """A slapd of the test's own: the platform's directory sync does not push to it."""
    inst = Instance(data_dir=tmp_path / "slapd", port=free_port())
    with sites_running({"own": inst}):
        for name, value in inst.env.items():
            setattr(settings, name, value)
        yield inst


@pytest.mark.django_db(transaction=True)
def test_an_entry_added_for_a_topic_deleted_meanwhile_is_removed_again(directory, monkeypatch):
    from topics.models import Topic

    Topic.objects.create(name="PushRace", path="PushRace")
    real = services._entry_uuid

    def deleted_meanwhile(conn, dn):  # type: ignore[no-untyped-def]
        # The entry is written; an operator deletes the topic before the push links it.
        Topic.objects.filter(path="PushRace").delete()
        return real(conn, dn)

    monkeypatch.setattr(services, "_entry_uuid", deleted_meanwhile)

    done = services.topics_push()

    assert "delete PushRace (deleted while it was added)" in done
    # Else the directory sync would make the deleted topic again from its entry.
    assert entry(directory, topic_dn("PushRace")) is None
    assert not TopicLink.objects.filter(dn__icontains="cn=PushRace").exists()
    assert not Topic.objects.filter(path="PushRace").exists()
