"""`manage.py directory_reconcile` names every difference and repairs it in the direction asked."""

from __future__ import annotations

import pytest

from tests.directory.helpers import (
    entry,
    ldapdelete,
    ldif,
    reconcile_output,
    subscribe_written,
    subscription_dn,
    sync_process_stopped,
    topic_dn,
)
from tests.support import wait_until

pytestmark = pytest.mark.integration


def test_reconcile_reports_drift_and_repairs_it_both_ways(
    platform, ldap_directory, db_access, committed, consumer_factory, dir_root
):
    from subscriptions.models import Subscription
    from topics.models import Topic
    from topics.services import topic_create

    def reconcile(*args: str) -> str:
        # Its own committed connection: the platform and later tests see what it repaired.
        return str(committed(reconcile_output, *args))

    d = ldap_directory
    tool, soup, alarm, only = (f"{dir_root}:{n}" for n in ("Tool", "Soup", "Alarm", "OnlyInLdap"))
    for path in (tool, alarm):
        committed(topic_create, path=path)
    assert wait_until(lambda: entry(d, topic_dn(alarm)) is not None, timeout=10)
    consumer = consumer_factory()
    sub_a = subscribe_written(platform, d, consumer.url, tool)[0]
    sub_b = subscribe_written(platform, d, consumer.url, alarm)[0]
    with sync_process_stopped(platform):
        assert wait_until(lambda: "in step" in reconcile(), timeout=20), reconcile()
        # Drift on both sides, behind the synchronisation's back.
        committed(lambda: Topic.objects.filter(path=tool).update(priority=3))
        committed(topic_create, path=soup)
        ldif(d, f"dn: {topic_dn(alarm)}\nchangetype: modify\nreplace: description\n"
                "description: edited in the directory\n")  # fmt: skip
        ldif(d, f"dn: {topic_dn(only)}\nobjectClass: hpwsnTopic\ncn: OnlyInLdap\n"
                "hpwsnTopicName: OnlyInLdap\n", tool="ldapadd")  # fmt: skip
        ldapdelete(d, subscription_dn(sub_a))
        ldif(d, f"dn: {subscription_dn(sub_b)}\nchangetype: modify\nreplace: hpwsnState\n"
                "hpwsnState: paused\n")  # fmt: skip

        report = reconcile()
        assert f"topic {tool}: differs: priority (Django 3, directory None)" in report, report
        assert f"topic {soup}: only in Django" in report
        assert f"topic {alarm}: differs: description" in report
        assert f"topic {only}: only in the directory" in report
        assert f"subscription {sub_a}: only in Django" in report
        assert f"subscription {sub_b}: differs: state" in report

        dry = reconcile("--direction", "django-to-ldap", "--dry-run")
        assert "would do" in dry
        assert reconcile() == report, "a dry run changed something"

        fixed = reconcile("--direction", "django-to-ldap")
        assert f"delete {only} from the directory" in fixed, fixed
        assert "in step" in reconcile(), reconcile()
        assert entry(d, topic_dn(tool))["hpwsnPriority"] == ["3"]  # type: ignore[index]
        assert entry(d, topic_dn(soup)) is not None
        assert entry(d, topic_dn(only)) is None
        assert "description" not in entry(d, topic_dn(alarm))  # type: ignore[operator]
        assert entry(d, subscription_dn(sub_a)) is not None
        assert entry(d, subscription_dn(sub_b))["hpwsnState"] == ["active"]  # type: ignore[index]

        # The other way: the directory is right, Django has drifted.
        ldif(d, f"dn: {topic_dn(tool)}\nchangetype: modify\nreplace: hpwsnPriority\n"
                "hpwsnPriority: 9\n")  # fmt: skip
        ldapdelete(d, topic_dn(soup))
        committed(lambda: Subscription.objects.filter(id=sub_a).delete())  # lost from the database
        ldapdelete(d, subscription_dn(sub_b))  # removed by the directory's administrator
        report = reconcile("--direction", "ldap-to-django")
        assert f"topic {soup}: only in Django" in report, report
        assert f"subscription {sub_a}: only in the directory" in report
        assert "in step" in reconcile(), reconcile()
        assert Topic.objects.get(path=tool).priority == 9
        assert not Topic.objects.filter(path=soup).exists()
        restored = Subscription.objects.get(id=sub_a)
        assert (restored.consumer_address, restored.topic_path) == (consumer.url, tool)
        assert not Subscription.objects.filter(id=sub_b).exists()
