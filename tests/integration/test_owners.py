"""Subscriptions and pull points belong to the principal that created them.

Renew, Unsubscribe, PauseSubscription, ResumeSubscription, GetMessages and DestroyPullPoint by
anyone but the owner are refused with hpwsn:NotAuthorized, unless the caller is in hpwsn-admins
or hpwsn-operators. The demo directory has subscriber1 and publisher1 (plain users), operator1,
admin1 and analyst1 (read-only).
"""

from __future__ import annotations

import base64
import uuid
from xml.sax.saxutils import escape

import httpx
import pytest
from lxml import etree
from zeep.wsse.username import UsernameToken

from hpwsn import ns
from subscriptions.models import PullPoint, Subscription
from tests.support import (
    CT,
    SOAP_NS,
    SoapResult,
    notify_xml,
    subscribe_xml,
    topic_with_policy,
    wait_or_fail,
)

pytestmark = pytest.mark.integration

TOPIC = "OwnedAlarms"  # anyone may publish and subscribe: only ownership is tested here
WSNT_DECL = f'xmlns:wsnt="{ns.WSNT}"'


@pytest.fixture
def topic(platform, committed):  # type: ignore[no-untyped-def]
    committed(topic_with_policy, TOPIC, anonymous_publish=True, anonymous_subscribe=True)
    return TOPIC


@pytest.fixture
def as_user(ldap_directory):  # type: ignore[no-untyped-def]
    """Credentials of a demo user: a UsernameToken (text) by default, or HTTP Basic."""

    def make(user: str | None, *, digest: bool = False) -> dict[str, object]:
        if user is None:
            return {}
        return {"token": UsernameToken(user, ldap_directory.demo_password(user), use_digest=digest)}

    return make


def call(  # type: ignore[no-untyped-def]
    platform,
    body_xml: str,
    *,
    to: str | None = None,
    token: UsernameToken | None = None,
    basic: tuple[str, str] | None = None,
) -> SoapResult:
    """POST a SOAP 1.1 envelope to /wsn/, addressed to `to`, signed with a UsernameToken."""
    header = f"<wsa:MessageID>urn:uuid:{uuid.uuid4()}</wsa:MessageID>"
    if to:
        header += f"<wsa:To>{escape(to)}</wsa:To>"
    envelope = etree.fromstring(
        f'<s:Envelope xmlns:s="{SOAP_NS["1.1"]}" xmlns:wsnt="{ns.WSNT}" xmlns:wsa="{ns.WSA}">'
        f"<s:Header>{header}</s:Header><s:Body>{body_xml}</s:Body></s:Envelope>"
    )
    if token is not None:
        envelope, _ = token.apply(envelope, {})
    headers = {"Content-Type": CT["1.1"]}
    if basic is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(":".join(basic).encode()).decode()
    resp = httpx.post(
        platform.endpoint, content=etree.tostring(envelope), headers=headers, timeout=30
    )
    root = etree.fromstring(resp.content) if resp.content.strip().startswith(b"<") else None
    return SoapResult(resp.status_code, resp.content, root, dict(resp.headers))


def subscribe(platform, consumer_url: str, **auth) -> str:  # type: ignore[no-untyped-def]
    res = call(platform, subscribe_xml(consumer_url, TOPIC), **auth)
    assert res.status == 200, res.body
    address = res.findtext(".//wsnt:SubscriptionReference/wsa:Address")
    assert address
    return address


def publish(platform, text: str) -> None:  # type: ignore[no-untyped-def]
    res = call(platform, notify_xml((TOPIC, f"<o:ev xmlns:o='urn:owners'>{text}</o:ev>")))
    assert res.status == 202, res.body


OPERATIONS = {
    "Renew": "<wsnt:Renew><wsnt:TerminationTime>PT2H</wsnt:TerminationTime></wsnt:Renew>",
    "Unsubscribe": "<wsnt:Unsubscribe/>",
    "PauseSubscription": "<wsnt:PauseSubscription/>",
    "ResumeSubscription": "<wsnt:ResumeSubscription/>",
}


def assert_refused(res: SoapResult, *, principal: str | None, operation: str, resource: str):  # type: ignore[no-untyped-def]
    assert res.status == 500, res.body
    assert res.fault_name == "NotAuthorized", res.body
    assert res.root is not None
    code = res.root.findtext(".//faultcode") or ""
    assert code.endswith("Client"), code  # a Sender fault
    detail = res.root.find(f".//{{{ns.HPWSN}}}NotAuthorized")
    assert detail is not None, res.body
    who = detail.find(f"{{{ns.HPWSN}}}Principal")
    assert who is not None
    if principal is None:
        assert who.get("anonymous") == "true"
    else:
        assert who.text == principal
    assert detail.findtext(f"{{{ns.HPWSN}}}Operation") == operation
    assert detail.findtext(f"{{{ns.HPWSN}}}Resource") == resource


def row(committed, sub_address: str) -> Subscription | None:  # type: ignore[no-untyped-def]
    sub_id = sub_address.rstrip("/").rsplit("/", 1)[-1]
    return committed(lambda: Subscription.objects.filter(id=sub_id).first())


# ----------------------------------------------------------------------------- the probe


def test_an_anonymous_unsubscribe_of_a_users_subscription_is_refused_and_it_still_delivers(
    platform, topic, consumer_factory, as_user, committed
):
    consumer = consumer_factory()
    address = subscribe(platform, consumer.url, **as_user("subscriber1"))

    res = call(platform, OPERATIONS["Unsubscribe"], to=address)

    assert_refused(res, principal=None, operation="Unsubscribe", resource=address)
    assert "authenticate as its owner" in res.fault_text
    publish(platform, "still here")
    assert consumer.wait_for(1)
    assert consumer.payload_texts() == ["still here"]
    sub = row(committed, address)
    assert sub is not None
    assert sub.owner == "user:subscriber1"


@pytest.mark.parametrize("operation", list(OPERATIONS))
@pytest.mark.parametrize("caller", [None, "publisher1", "analyst1"])
def test_nobody_but_the_owner_or_staff_may_act_on_a_subscription(
    platform, topic, consumer_factory, as_user, committed, operation, caller
):
    consumer = consumer_factory()
    address = subscribe(platform, consumer.url, **as_user("subscriber1"))
    before = row(committed, address)

    res = call(platform, OPERATIONS[operation], to=address, **as_user(caller))

    assert_refused(res, principal=caller, operation=operation, resource=address)
    after = row(committed, address)
    assert after is not None
    assert before is not None
    assert (after.state, after.termination_time) == (before.state, before.termination_time)


@pytest.mark.parametrize("caller", ["subscriber1", "operator1", "admin1"])
def test_the_owner_operators_and_admins_may_renew_pause_resume_and_end_it(
    platform, topic, consumer_factory, as_user, committed, caller
):
    consumer = consumer_factory()
    address = subscribe(platform, consumer.url, **as_user("subscriber1"))
    auth = as_user(caller)

    answers = [
        call(platform, OPERATIONS[op], to=address, **auth)
        for op in ("PauseSubscription", "ResumeSubscription", "Renew")
    ]
    paused_and_renewed = row(committed, address)
    gone = call(platform, OPERATIONS["Unsubscribe"], to=address, **as_user(caller))

    assert [a.status for a in answers] == [200, 200, 200], [a.body for a in answers]
    assert paused_and_renewed is not None
    assert paused_and_renewed.state == Subscription.State.ACTIVE
    assert paused_and_renewed.termination_time is not None
    assert gone.status == 200, gone.body
    assert row(committed, address) is None


def test_a_subscription_made_without_credentials_may_be_ended_by_whoever_holds_its_address(
    platform, topic, consumer_factory, as_user, committed
):
    consumer = consumer_factory()
    address = subscribe(platform, consumer.url)

    res = call(platform, OPERATIONS["Unsubscribe"], to=address, **as_user("publisher1"))

    assert res.status == 200, res.body
    assert row(committed, address) is None


def test_a_user_logged_in_by_another_spelling_of_its_uid_is_still_the_owner(
    platform, topic, consumer_factory, ldap_directory, committed
):
    consumer = consumer_factory()
    address = subscribe(
        platform, consumer.url, basic=("subscriber1", ldap_directory.demo_password("subscriber1"))
    )

    res = call(
        platform,
        OPERATIONS["Unsubscribe"],
        to=address,
        basic=("SUBSCRIBER1", ldap_directory.demo_password("subscriber1")),
    )

    assert res.status == 200, res.body
    assert row(committed, address) is None


def test_subscription_and_pull_point_addresses_carry_random_version_4_uuids(
    platform, topic, consumer_factory
):
    addresses = [subscribe(platform, consumer_factory().url) for _ in range(3)]
    addresses += [create_pull_point(platform) for _ in range(3)]

    ids = [uuid.UUID(a.rsplit("/", 1)[-1]) for a in addresses]

    assert [i.version for i in ids] == [4] * 6  # 122 random bits each
    assert len(set(ids)) == 6


# ----------------------------------------------------------------------------- pull points


def create_pull_point(platform, **auth) -> str:  # type: ignore[no-untyped-def]
    res = call(platform, "<wsnt:CreatePullPoint/>", **auth)
    assert res.status == 200, res.body
    address = res.findtext(".//wsnt:PullPoint/wsa:Address")
    assert address
    return address


def get_messages(platform, address: str, **auth) -> SoapResult:  # type: ignore[no-untyped-def]
    body = "<wsnt:GetMessages><wsnt:MaximumNumber>10</wsnt:MaximumNumber></wsnt:GetMessages>"
    return call(platform, body, to=address, **auth)


def pulled(res: SoapResult) -> list[str]:
    assert res.status == 200, res.body
    assert res.root is not None
    return [
        "".join(m.itertext())
        for m in res.root.iterfind(".//wsnt:NotificationMessage/wsnt:Message", {"wsnt": ns.WSNT})
    ]


def test_only_the_owner_or_staff_may_read_or_destroy_a_pull_point(
    platform, topic, as_user, committed
):
    owner = as_user("subscriber1")
    pp = create_pull_point(platform, **owner)
    subscribe(platform, pp, **owner)
    publish(platform, "for the owner")
    wait_or_fail(
        lambda: platform.redis().llen(f"hpwsn:pp:{pp.rsplit('/', 1)[-1]}") > 0,
        15,
        "the message in the pull point",
    )

    anonymous_read = get_messages(platform, pp)
    other_read = get_messages(platform, pp, **as_user("publisher1"))
    other_destroy = call(platform, "<wsnt:DestroyPullPoint/>", to=pp, **as_user("analyst1"))
    owner_read = get_messages(platform, pp, **owner)
    operator_read = get_messages(platform, pp, **as_user("operator1"))
    operator_destroy = call(platform, "<wsnt:DestroyPullPoint/>", to=pp, **as_user("operator1"))

    assert_refused(anonymous_read, principal=None, operation="GetMessages", resource=pp)
    assert_refused(other_read, principal="publisher1", operation="GetMessages", resource=pp)
    assert_refused(other_destroy, principal="analyst1", operation="DestroyPullPoint", resource=pp)
    assert pulled(owner_read) == ["for the owner"]  # nothing was taken by the refused reads
    assert pulled(operator_read) == []
    assert operator_destroy.status == 200, operator_destroy.body
    pp_row = committed(lambda: PullPoint.objects.get(id=pp.rsplit("/", 1)[-1]))
    assert pp_row.owner == "user:subscriber1"
    assert pp_row.destroyed_at is not None


def test_nobody_else_may_subscribe_into_someone_elses_pull_point(platform, topic, as_user):
    pp = create_pull_point(platform, **as_user("subscriber1"))

    res = call(platform, subscribe_xml(pp, TOPIC))

    assert_refused(res, principal=None, operation="Subscribe", resource=pp)


# ----------------------------------------------------------------------------- legacy


def test_the_legacy_wsn_process_envelope_refuses_another_principals_unsubscribe(
    platform, topic, consumer_factory, as_user, committed
):
    consumer = consumer_factory()
    address = subscribe(platform, consumer.url, **as_user("subscriber1"))
    inner = f"<wsnt:Unsubscribe {WSNT_DECL}/>"
    wrapped = f'<org:WsnProcess xmlns:org="{ns.LEGACY}">{inner}</org:WsnProcess>'

    on_wsn = call(platform, wrapped, to=address)
    spyne = httpx.post(
        platform.base_url + "/wsn/legacy/",
        content=(
            f'<soapenv:Envelope xmlns:soapenv="{ns.SOAP11}" xmlns:org="{ns.LEGACY}">'
            f'<soapenv:Header><wsa:To xmlns:wsa="{ns.WSA}">{escape(address)}</wsa:To>'
            f"</soapenv:Header><soapenv:Body><org:WsnProcess><org:message>{escape(inner)}"
            "</org:message></org:WsnProcess></soapenv:Body></soapenv:Envelope>"
        ).encode(),
        headers={"Content-Type": "text/xml; charset=utf-8"},
        timeout=30,
    )

    assert_refused(on_wsn, principal=None, operation="Unsubscribe", resource=address)
    assert spyne.status_code == 500, spyne.text
    assert "may not Unsubscribe" in spyne.text
    assert row(committed, address) is not None
    publish(platform, "legacy-proof")
    assert consumer.wait_for(1)


# ----------------------------------------------------------------------------- duplicates


def test_a_duplicate_subscribe_from_another_principal_gets_its_own_subscription(
    platform, topic, consumer_factory, as_user, committed
):
    consumer = consumer_factory()
    first = subscribe(platform, consumer.url, **as_user("subscriber1"))

    from_anonymous = subscribe(platform, consumer.url)
    from_publisher = subscribe(platform, consumer.url, **as_user("publisher1"))
    again = subscribe(platform, consumer.url, **as_user("subscriber1"))

    assert len({first, from_anonymous, from_publisher}) == 3
    assert again == first
    # Each principal may end its own, and only its own.
    refused = call(platform, OPERATIONS["Unsubscribe"], to=first, **as_user("publisher1"))
    assert refused.fault_name == "NotAuthorized", refused.body
    ended = call(platform, OPERATIONS["Unsubscribe"], to=from_publisher, **as_user("publisher1"))
    assert ended.status == 200, ended.body
    assert row(committed, first) is not None
