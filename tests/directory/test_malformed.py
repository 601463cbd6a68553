"""Malformed directory data is reported by DN and skipped; everything else still loads."""

from __future__ import annotations

import io

import httpx
import pytest
from django.core.management import call_command

from tests.directory.helpers import ldapdelete, ldif, sync_process_stopped, topic_dn
from tests.support import wait_until

pytestmark = pytest.mark.integration

NO_NAME = f"cn=Nameless,{topic_dn('DirTests')}"
BAD_POLICY = topic_dn("DirTests:Sometimes")
GOOD = "DirTests:Good"
CYCLE = f"cn=Loop,{topic_dn(GOOD)}"
BELOW_BAD = topic_dn("DirTests:Sometimes:Child")


def skipped_reasons() -> dict[str, str]:
    from directory.services import SKIPPED
    from hpwsn_site import state

    raw = state.get_redis().hgetall(SKIPPED)
    return {k.decode(): v.decode() for k, v in raw.items()}


def test_malformed_entries_are_reported_by_dn_and_skipped_without_stopping_the_sync(
    platform, ldap_directory, db_access, dir_root
):
    from topics.models import Topic

    d = ldap_directory
    ldif(
        d,
        f"""
dn: {NO_NAME}
objectClass: hpwsnTopic
cn: Nameless

dn: {BAD_POLICY}
objectClass: hpwsnTopic
cn: Sometimes
hpwsnTopicName: Sometimes
hpwsnReliability: sometimes

dn: {BELOW_BAD}
objectClass: hpwsnTopic
cn: Child
hpwsnTopicName: Child

dn: {topic_dn(GOOD)}
objectClass: hpwsnTopic
cn: Good
hpwsnTopicName: Good
hpwsnPriority: 4

dn: {CYCLE}
objectClass: alias
objectClass: extensibleObject
cn: Loop
aliasedObjectName: {topic_dn("DirTests")}
""",
        tool="ldapadd",
    )
    try:
        assert wait_until(lambda: Topic.objects.filter(path=GOOD).exists(), 10), platform.logs()
        assert Topic.objects.get(path=GOOD).priority == 4
        assert not Topic.objects.filter(path__startswith="DirTests:Sometimes").exists()
        assert not Topic.objects.filter(name__in=["Nameless", "Loop"]).exists()
        assert wait_until(lambda: {NO_NAME, BAD_POLICY, CYCLE} <= set(skipped_reasons()), 10)
        reasons = skipped_reasons()
        assert "no name" in reasons[NO_NAME]
        assert "unknown hpwsnReliability 'sometimes'" in reasons[BAD_POLICY]
        assert "cycle" in reasons[CYCLE]
        # The sync process is still alive and still follows the directory.
        assert platform.procs["directory"].poll() is None
        ldif(d, f"dn: {topic_dn(GOOD)}\nchangetype: modify\nreplace: hpwsnPriority\n"
                "hpwsnPriority: 5\n")  # fmt: skip
        assert wait_until(lambda: Topic.objects.get(path=GOOD).priority == 5, 5)
        assert httpx.get(platform.base_url + "/healthz", timeout=5).status_code == 200

        # Reconcile names the skipped entries by DN, with the reason.
        out = io.StringIO()
        call_command("directory_reconcile", stdout=out)
        assert f"entry {BAD_POLICY}: skipped: unknown hpwsnReliability" in out.getvalue()
        assert f"entry {BELOW_BAD}: skipped: its parent entry was skipped" in out.getvalue()
    finally:
        ldapdelete(d, CYCLE, BELOW_BAD, BAD_POLICY, NO_NAME, topic_dn(GOOD))


def test_the_loader_skips_a_malformed_entry_at_start_up_and_loads_the_rest(
    platform, ldap_directory, db_access, committed, dir_root
):
    from directory.services import directory_load

    d = ldap_directory
    bad, fine = f"cn=Slow,{topic_dn(dir_root)}", f"cn=Fine,{topic_dn(dir_root)}"
    try:
        # The sync process would apply the good entry itself: only the loader may here.
        with sync_process_stopped(platform):
            ldif(
                d,
                f"dn: {bad}\nobjectClass: hpwsnTopic\ncn: Slow\nhpwsnTopicName: Slow\n"
                "hpwsnRetrySchedule: 1,soon,5\n\n"
                f"dn: {fine}\nobjectClass: hpwsnTopic\ncn: Fine\nhpwsnTopicName: Fine\n",
                tool="ldapadd",
            )
            report = committed(directory_load)
        assert (bad, "hpwsnRetrySchedule must be seconds, comma separated, not '1,soon,5'") in (
            report.skipped
        )
        from topics.models import Topic

        assert not Topic.objects.filter(path=f"{dir_root}:Slow").exists()
        assert f"{dir_root}:Fine" in report.created
        assert Topic.objects.filter(path=f"{dir_root}:Fine").exists()
    finally:
        ldapdelete(d, bad, fine)


def test_a_directory_without_the_topics_subtree_deletes_nothing(db, ldap_directory, settings):
    from directory.ldapconn import DirectoryUnavailable
    from directory.services import directory_load
    from topics.models import Topic
    from topics.services import topic_create

    topic_create(path="Kept:Here")
    settings.HPWSN_LDAP_TOPICS_DN = "ou=nowhere,dc=hpwsn,dc=local"
    with pytest.raises(DirectoryUnavailable, match="missing or not readable"):
        directory_load()
    assert Topic.objects.filter(path="Kept:Here").exists()


def test_an_empty_broker_password_is_refused_rather_than_bound_anonymously(
    ldap_directory, settings
):
    from directory.ldapconn import DirectoryUnavailable, directory_connect

    settings.HPWSN_LDAP_BIND_PASSWORD = ""
    with pytest.raises(DirectoryUnavailable, match="PASSWORD is empty"):
        directory_connect()
