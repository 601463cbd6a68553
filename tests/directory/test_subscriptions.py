"""Subscriptions made over SOAP are written to the directory, also across a directory outage."""

from __future__ import annotations

import httpx
import pytest

from directory.models import SubscriptionWrite
from tests.directory.helpers import (
    entry,
    ldapdelete,
    ldif,
    subscribe_written,
    subscription_dn,
    subscription_id,
    topic_dn,
)
from tests.support import notify_xml, soap_call, subscribe_xml, wait_until

pytestmark = pytest.mark.integration


def directory_status(platform) -> str:  # type: ignore[no-untyped-def]
    return str(
        httpx.get(platform.base_url + "/healthz", timeout=5).json()["checks"]["directory"]["status"]
    )


def test_a_soap_subscribe_is_written_to_the_directory_and_an_unsubscribe_removes_it(
    platform, ldap_directory, consumer_factory, dir_root
):
    consumer = consumer_factory()
    res = soap_call(platform.endpoint, subscribe_xml(consumer.url, dir_root))
    assert res.status == 200, res.body
    sub_id = subscription_id(res)
    dn = subscription_dn(sub_id)
    assert wait_until(lambda: entry(ldap_directory, dn) is not None, timeout=10), platform.logs()
    written = entry(ldap_directory, dn)
    assert written["hpwsnConsumerAddress"] == [consumer.url]  # type: ignore[index]
    assert written["hpwsnTopicExpression"] == [dir_root]  # type: ignore[index]
    assert written["hpwsnState"] == ["active"]  # type: ignore[index]

    pause = soap_call(
        f"{platform.base_url}/wsn/subscriptions/{sub_id}",
        "<wsnt:PauseSubscription/>",
    )
    assert pause.status == 200, pause.body
    assert wait_until(
        lambda: (entry(ldap_directory, dn) or {}).get("hpwsnState") == ["paused"], timeout=10
    )

    gone = soap_call(f"{platform.base_url}/wsn/subscriptions/{sub_id}", "<wsnt:Unsubscribe/>")
    assert gone.status == 200, gone.body
    assert wait_until(lambda: entry(ldap_directory, dn) is None, timeout=10), platform.logs()


def test_with_the_directory_down_the_broker_serves_and_queues_and_nothing_is_lost(
    platform, ldap_directory, consumer_factory, committed, dir_root
):
    from topics.services import topic_create

    consumer = consumer_factory()
    assert wait_until(lambda: directory_status(platform) == "ok", timeout=15), platform.logs()
    ldap_directory.stop()
    try:
        res = soap_call(platform.endpoint, subscribe_xml(consumer.url, dir_root))
        assert res.status == 200, res.body
        sub_id = subscription_id(res)
        committed(topic_create, path=f"{dir_root}:WhileDown")
        assert wait_until(lambda: directory_status(platform) == "degraded", timeout=15)
        # The broker keeps serving from its database: the subscription receives.
        notify = notify_xml((dir_root, "<e:ev xmlns:e='urn:d'>while down</e:ev>"))
        assert soap_call(platform.endpoint, notify).status in (200, 202)
        assert consumer.wait_for(1), platform.logs()
    finally:
        ldap_directory.start()
    assert wait_until(
        lambda: entry(ldap_directory, subscription_dn(sub_id)) is not None, timeout=40
    ), platform.logs()
    assert wait_until(
        lambda: entry(ldap_directory, topic_dn(f"{dir_root}:WhileDown")) is not None, timeout=40
    ), platform.logs()
    assert wait_until(lambda: directory_status(platform) == "ok", timeout=20), platform.logs()
    unsubscribe = soap_call(
        f"{platform.base_url}/wsn/subscriptions/{sub_id}", "<wsnt:Unsubscribe/>"
    )
    assert unsubscribe.status == 200


def test_an_operator_edit_of_a_subscription_entry_reaches_the_broker(
    platform, ldap_directory, consumer_factory, db_access, dir_root
):
    from subscriptions.models import Subscription

    sub_id, dn = subscribe_written(platform, ldap_directory, consumer_factory().url, dir_root)

    ldif(
        ldap_directory,
        f"dn: {dn}\nchangetype: modify\nreplace: hpwsnState\nhpwsnState: paused\n-\n"
        "replace: hpwsnTerminationTime\nhpwsnTerminationTime: 20991231000000Z\n",
    )
    assert wait_until(lambda: Subscription.objects.get(id=sub_id).state == "paused", timeout=5), (
        platform.logs()
    )
    assert wait_until(
        lambda: Subscription.objects.get(id=sub_id).termination_time.year == 2099, timeout=5
    )

    ldapdelete(ldap_directory, dn)
    assert wait_until(lambda: not Subscription.objects.filter(id=sub_id).exists(), timeout=5), (
        platform.logs()
    )


def test_subscriptions_lost_from_the_database_are_restored_at_start_up_and_deliver(
    platform, ldap_directory, consumer_factory, db_access, committed, dir_root
):
    from directory.services import directory_load
    from subscriptions.models import Subscription

    consumer = consumer_factory()
    sub_id, _dn = subscribe_written(platform, ldap_directory, consumer.url, dir_root)
    # The row disappears behind the broker's back (a database restored from an old backup).
    committed(lambda: Subscription.objects.filter(id=sub_id).delete())

    report = committed(directory_load)

    assert sub_id in report.restored
    restored = Subscription.objects.get(id=sub_id)
    assert (restored.consumer_address, restored.topic_path) == (consumer.url, dir_root)
    note = notify_xml((dir_root, "<e:ev xmlns:e='urn:d'>after restore</e:ev>"))
    assert soap_call(platform.endpoint, note).status in (200, 202)
    assert consumer.wait_for(1), platform.logs()
    assert soap_call(restored.reference_address, "<wsnt:Unsubscribe/>").status == 200


def test_an_entry_read_before_the_brokers_newer_write_is_never_applied_back(
    platform, ldap_directory, consumer_factory, db_access, committed, dir_root
):
    """The sync process reads an entry (active), the broker then suspends the subscription and
    writes that to the directory: the entry read before is the broker's own and changes nothing."""
    import ldap
    from django.conf import settings

    from directory import services, sync
    from subscriptions.models import Subscription
    from subscriptions.services import subscription_suspend

    sub_id, dn = subscribe_written(platform, ldap_directory, consumer_factory().url, dir_root)
    conn = services.directory_connect()
    try:
        [(_dn, attrs)] = conn.search_s(dn, ldap.SCOPE_BASE, attrlist=["entryUUID"])
        uuid = attrs["entryUUID"][0].decode()
        stale = sync._current(conn, settings.HPWSN_LDAP_SUBSCRIPTIONS_DN, uuid)
    finally:
        conn.unbind_s()
    assert stale is not None
    assert stale.first("hpwsnState") == "active"

    assert committed(subscription_suspend, subscription_id=sub_id)
    assert wait_until(lambda: entry(ldap_directory, dn)["hpwsnState"] == ["suspended"], timeout=10)  # type: ignore[index]
    assert wait_until(lambda: not SubscriptionWrite.objects.filter(subscription_id=sub_id).exists())

    assert committed(services.subscription_entry_apply, entry=stale) == ""
    assert Subscription.objects.get(id=sub_id).state == "suspended"


def test_an_sql_filter_with_parameters_survives_a_restore_from_the_directory(
    platform, ldap_directory, consumer_factory, db_access, committed, dir_root
):
    from directory.services import directory_load
    from hpwsn import ns
    from hpwsn.sqlfilter import DIALECT
    from subscriptions.models import Subscription

    consumer = consumer_factory()
    body = subscribe_xml(
        consumer.url,
        dir_root,
        extra=f'<wsnt:MessageContent Dialect="{DIALECT}">ev.n = %0</wsnt:MessageContent>'
        f'<wsnt:ProducerProperties Dialect="{DIALECT}">$producer IS NULL'
        "</wsnt:ProducerProperties>",
    ).replace(
        "</wsnt:Subscribe>",
        f'<wsnt:SubscriptionPolicy><hpwsn:FilterParameters xmlns:hpwsn="{ns.HPWSN}">'
        "<hpwsn:Parameter>2</hpwsn:Parameter></hpwsn:FilterParameters>"
        "</wsnt:SubscriptionPolicy></wsnt:Subscribe>",
    )
    res = soap_call(platform.endpoint, body)
    assert res.status == 200, res.body
    sub_id = subscription_id(res)
    assert wait_until(lambda: entry(ldap_directory, subscription_dn(sub_id)) is not None)
    assert wait_until(lambda: not SubscriptionWrite.objects.filter(subscription_id=sub_id).exists())
    committed(lambda: Subscription.objects.filter(id=sub_id).delete())

    report = committed(directory_load)

    assert sub_id in report.restored
    restored = Subscription.objects.get(id=sub_id)
    assert restored.filter_parameters == [2]
    assert restored.producer_filter == "$producer IS NULL"
    note = notify_xml(
        (dir_root, "<e:ev xmlns:e='urn:d'><e:n>1</e:n></e:ev>"),
        (dir_root, "<e:ev xmlns:e='urn:d'><e:n>2</e:n></e:ev>"),
    )
    assert soap_call(platform.endpoint, note).status in (200, 202)
    assert consumer.wait_for(1), platform.logs()
    assert consumer.payload_texts() == ["2"]
    assert soap_call(restored.reference_address, "<wsnt:Unsubscribe/>").status == 200
