"""Directory tests work under a root topic of their own, so the demo tree other tests use stays
as it was seeded."""

from __future__ import annotations

import pytest

from tests.directory.helpers import entry, ldif, topic_dn
from tests.support import wait_until

ROOT_TOPIC = "DirTests"


@pytest.fixture
def dir_root(platform, ldap_directory, db_access) -> str:  # type: ignore[no-untyped-def]
    """The root topic `DirTests` (anonymous publish and subscribe) in the directory and broker."""
    from topics.models import Topic

    if entry(ldap_directory, topic_dn(ROOT_TOPIC)) is None:
        ldif(
            ldap_directory,
            f"dn: {topic_dn(ROOT_TOPIC)}\nobjectClass: hpwsnTopic\ncn: {ROOT_TOPIC}\n"
            f"hpwsnTopicName: {ROOT_TOPIC}\nhpwsnAnonymousPublish: TRUE\n"
            "hpwsnAnonymousSubscribe: TRUE\n",
            tool="ldapadd",
        )
    assert wait_until(lambda: Topic.objects.filter(path=ROOT_TOPIC).exists(), timeout=10), (
        platform.logs()
    )
    return ROOT_TOPIC
