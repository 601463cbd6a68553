"""What a subscription's directory entry keeps comes back with it: its owner, its signing secret."""

from __future__ import annotations

import json

import httpx
import pytest

from hpwsn import ns
from tests.directory.helpers import (
    entry,
    reconcile_output,
    subscription_dn,
    subscription_id,
    sync_process_stopped,
)
from tests.support import SoapResult, soap_call, subscribe_xml, wait_until

pytestmark = pytest.mark.integration


def test_the_owner_is_written_to_the_directory_and_restored_from_it(
    platform, ldap_directory, db_access, committed, consumer_factory, dir_root
):
    from lxml import etree

    from directory.models import SubscriptionWrite
    from subscriptions.models import Subscription
    from tests.support import CT

    consumer = consumer_factory()
    auth = ("subscriber1", ldap_directory.demo_password("subscriber1"))

    def subscribe() -> SoapResult:
        envelope = (
            f'<s:Envelope xmlns:s="{ns.SOAP11}" xmlns:wsnt="{ns.WSNT}" xmlns:wsa="{ns.WSA}">'
            f"<s:Body>{subscribe_xml(consumer.url, dir_root)}</s:Body></s:Envelope>"
        )
        resp = httpx.post(
            platform.endpoint,
            content=envelope.encode(),
            headers={"Content-Type": CT["1.1"]},
            auth=auth,
            timeout=30,
        )
        return SoapResult(resp.status_code, resp.content, etree.fromstring(resp.content))

    made = subscribe()
    assert made.status == 200, made.body
    sub_id = subscription_id(made)
    dn = subscription_dn(sub_id)
    assert wait_until(lambda: entry(ldap_directory, dn) is not None, timeout=10), platform.logs()
    assert wait_until(lambda: not SubscriptionWrite.objects.filter(subscription_id=sub_id).exists())
    details = json.loads(entry(ldap_directory, dn)["hpwsnDetails"][0])  # type: ignore[index]
    assert details["owner"] == "user:subscriber1"

    with sync_process_stopped(platform):
        committed(lambda: Subscription.objects.filter(id=sub_id).delete())  # lost from Django
        report = str(committed(reconcile_output, "--direction", "ldap-to-django"))
        assert f"subscription {sub_id}: only in the directory" in report, report
    restored = Subscription.objects.get(id=sub_id)
    assert restored.owner == "user:subscriber1"
    address = f"{platform.base_url}/wsn/subscriptions/{sub_id}"
    refused = soap_call(address, "<wsnt:Unsubscribe/>")
    assert refused.fault_name == "NotAuthorized", refused.body
    # Its dedup key came back too: the owner's identical Subscribe finds it.
    again = subscribe()
    assert subscription_id(again) == sub_id


def test_a_signed_subscription_restored_from_the_directory_still_signs_its_pushes(
    platform, ldap_directory, db_access, committed, consumer_factory, dir_root
):
    import base64
    import hashlib
    import hmac

    import ldap

    from directory.models import SubscriptionWrite
    from subscriptions.models import Subscription
    from tests.directory.test_directory_acl import PEOPLE, bind
    from tests.support import notify_xml

    consumer = consumer_factory()
    policy = (
        f'<wsnt:SubscriptionPolicy><h:SigningSecret xmlns:h="{ns.HPWSN}">kept s3cret'
        "</h:SigningSecret></wsnt:SubscriptionPolicy>"
    )
    made = soap_call(
        platform.endpoint,
        subscribe_xml(consumer.url, dir_root).replace(
            "</wsnt:Subscribe>", policy + "</wsnt:Subscribe>"
        ),
    )
    assert made.status == 200, made.body
    sub_id = subscription_id(made)
    dn = subscription_dn(sub_id)
    assert wait_until(lambda: entry(ldap_directory, dn) is not None, timeout=10), platform.logs()
    assert wait_until(lambda: not SubscriptionWrite.objects.filter(subscription_id=sub_id).exists())
    assert entry(ldap_directory, dn)["hpwsnSigningSecret"] == ["kept s3cret"]  # type: ignore[index]
    # The broker's alone: a directory user does not read it.
    operator = bind(
        ldap_directory, f"uid=operator1,{PEOPLE}", ldap_directory.demo_password("operator1")
    )
    try:
        seen = operator.search_s(dn, ldap.SCOPE_BASE, attrlist=["hpwsnSigningSecret"])
    except ldap.NO_SUCH_OBJECT:
        seen = []
    assert all("hpwsnSigningSecret" not in attrs for _dn, attrs in seen)

    with sync_process_stopped(platform):
        committed(lambda: Subscription.objects.filter(id=sub_id).delete())  # lost from Django
        report = str(committed(reconcile_output, "--direction", "ldap-to-django"))
        assert f"subscription {sub_id}: only in the directory" in report, report
    assert Subscription.objects.get(id=sub_id).signing_secret == "kept s3cret"

    res = soap_call(platform.endpoint, notify_xml((dir_root, "<e:m xmlns:e='urn:t'>after</e:m>")))
    assert res.status in (200, 202), res.body
    assert consumer.wait_for(1), platform.logs()
    got, headers = consumer.received[0], consumer.headers[0]
    mid, ts, sig = headers["webhook-id"], headers["webhook-timestamp"], headers["webhook-signature"]
    expected = hmac.new(b"kept s3cret", f"{mid}.{ts}.".encode() + got.raw, hashlib.sha256).digest()
    assert sig == "v1," + base64.b64encode(expected).decode()
