"""Limits a hostile publisher or subscriber cannot push the platform past: topics made by
publishing, and the bytes one GetMessages reply holds."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from hpwsn.wsn import TopicRef
from hpwsn_site import state
from tests.support import (
    ANONYMOUS_ALLOWED,
    notify_xml,
    soap_call,
    subscribe_xml,
    subscription_made,
    topic_with_policy,
    wait_until,
)
from topics.acl import Principal

pytestmark = pytest.mark.integration


@pytest.fixture
def creating_topic(committed) -> str:  # type: ignore[no-untyped-def]
    """A root that anonymous callers may publish on and that creates children on publish."""
    path = f"Grow{uuid.uuid4().hex[:8]}"
    committed(topic_with_policy, path, **ANONYMOUS_ALLOWED, auto_create_children=True)
    return path


def _topics_under(path: str) -> int:
    from topics.models import Topic

    return Topic.objects.filter(path__startswith=path + ":").count()


def test_one_notify_cannot_create_more_topics_than_the_limit(platform, creating_topic, db_access):
    from django.conf import settings

    limit = settings.HPWSN_AUTO_CREATE_MAX_PER_NOTIFY
    message = "<t xmlns='urn:t'>x</t>"
    too_many = [(f"{creating_topic}:S{i}", message) for i in range(limit + 1)]

    refused = soap_call(platform.endpoint, notify_xml(*too_many))

    assert refused.fault_name == "TopicNotSupportedFault", refused.body[:2000]
    assert "HPWSN_AUTO_CREATE_MAX_PER_NOTIFY" in refused.fault_text
    assert _topics_under(creating_topic) == 0
    # Within the limit, publishing still creates what it names, ancestors included.
    res = soap_call(platform.endpoint, notify_xml(*too_many[: limit // 2 - 1]))
    assert res.status == 202, res.body[:2000]
    nested = soap_call(platform.endpoint, notify_xml((f"{creating_topic}:A:B", message)))
    assert nested.status == 202, nested.body[:2000]
    assert _topics_under(creating_topic) == limit // 2 - 1 + 2


def test_a_topic_name_longer_than_a_topic_may_have_is_refused_by_name(
    platform, creating_topic, db_access
):
    long_name = "N" + "x" * 200
    res = soap_call(
        platform.endpoint, notify_xml((f"{creating_topic}:{long_name}", "<t xmlns='urn:t'/>"))
    )

    assert res.fault_name == "InvalidTopicExpressionFault", res.body[:2000]
    assert "128" in res.fault_text
    assert _topics_under(creating_topic) == 0


def test_a_topic_path_longer_than_a_topic_may_have_is_refused(platform, creating_topic, db_access):
    names = ":".join(f"N{i}" + "y" * 120 for i in range(10))  # each name fits; the path does not
    res = soap_call(
        platform.endpoint, notify_xml((f"{creating_topic}:{names}", "<t xmlns='urn:t'/>"))
    )

    assert res.fault_name == "InvalidTopicExpressionFault", res.body[:2000]
    assert "1024" in res.fault_text
    assert _topics_under(creating_topic) == 0


def test_one_get_messages_reply_holds_a_bounded_number_of_bytes_and_loses_nothing(
    platform, committed
):
    from django.conf import settings

    topic = f"Pulled{uuid.uuid4().hex[:8]}"
    committed(topic_with_policy, topic, **ANONYMOUS_ALLOWED)
    res = soap_call(platform.endpoint, "<wsnt:CreatePullPoint/>")
    pull_point = res.findtext(".//wsnt:PullPoint/wsa:Address")
    assert pull_point, res.body
    assert soap_call(platform.endpoint, subscribe_xml(pull_point, topic)).status == 200
    piece = 1024 * 1024
    sent = settings.HPWSN_PULL_BATCH_BYTES // piece + 3
    for i in range(sent):
        payload = f"<big xmlns='urn:t' n='{i}'>{'z' * piece}</big>"
        assert soap_call(platform.endpoint, notify_xml((topic, payload))).status == 202
    key = state.pullpoint_key(pull_point.rsplit("/", 1)[1])
    assert wait_until(lambda: platform.redis().llen(key) == sent, timeout=30)

    body = "<wsnt:GetMessages><wsnt:MaximumNumber>1000</wsnt:MaximumNumber></wsnt:GetMessages>"
    replies = []
    while True:
        reply = soap_call(pull_point, body, to=pull_point)
        assert reply.status == 200, reply.body[:2000]
        got = (
            [el.get("n") for el in reply.root.iter("{urn:t}big")] if reply.root is not None else []
        )
        if not got:
            break
        replies.append((len(reply.body), got))

    # Each reply stops at the message that brings it to the limit; the next takes the rest.
    assert all(size < settings.HPWSN_PULL_BATCH_BYTES + 2 * piece for size, _got in replies)
    assert len(replies) > 1
    assert [n for _size, got in replies for n in got] == [str(i) for i in range(sent)]


def test_publishing_creates_no_topic_once_the_tree_holds_the_most_topics(settings, monkeypatch):
    """In process: a tree at HPWSN_MAX_TOPICS refuses a publish that would add to it."""
    from lxml import etree

    from dispatch import accept
    from hpwsn import errors, wsn
    from topics.tree import Policy, TopicNode, TopicTree

    policy = Policy(auto_create_children=True, anonymous_publish=True)
    tree = TopicTree([TopicNode(id=1, names=("Grow",), root_namespace=None, policy=policy)])
    created: list[str] = []

    async def current(*, force: bool) -> TopicTree:
        return tree

    async def on_thread(fn, /, **kwargs):  # type: ignore[no-untyped-def]
        created.append(kwargs["path"])

    monkeypatch.setattr(accept, "_tree", current)
    monkeypatch.setattr(accept, "db", on_thread)
    settings.HPWSN_MAX_TOPICS = 2
    body = etree.fromstring(
        notify_xml(("Grow:A:B", "<t xmlns='urn:t'/>")).replace(
            "<wsnt:Notify>", '<wsnt:Notify xmlns:wsnt="http://docs.oasis-open.org/wsn/b-2">'
        )
    )

    with pytest.raises(errors.TopicNotSupported, match="HPWSN_MAX_TOPICS"):
        asyncio.run(accept.notifications_accept(notifications=wsn.parse_notify(body)))

    assert created == []


LOOPBACK = "@127.0.0.1"  # an anonymous publisher on the loopback (acl.Principal.publisher)
OWNER = Principal(name="hoarder", groups=frozenset({"hpwsn-admins"}))
OTHER = Principal(name="neighbour", groups=frozenset({"hpwsn-admins"}))


def _subscribe(principal: Principal, consumer: str) -> tuple[object, bool]:
    return subscription_made(consumer, "Hoard:Room", principal)


@pytest.mark.django_db(transaction=True)
def test_a_principal_holds_at_most_the_subscriptions_the_limit_allows(
    settings, monkeypatch
) -> None:
    from hpwsn import errors
    from subscriptions import services as subs
    from subscriptions.models import Subscription
    from topics.services import topic_create

    monkeypatch.setattr(subs, "_held", {})  # what this process counted in earlier tests

    topic_create(path="Hoard:Room")
    state.bump(state.VERSION_TOPICS)  # whatever tree an earlier test left in this process
    settings.HPWSN_MAX_SUBSCRIPTIONS_PER_OWNER = 3
    made = [_subscribe(OWNER, f"http://127.0.0.1:9/hoard/{i}")[0] for i in range(3)]

    with pytest.raises(errors.SubscribeCreationFailed, match="HPWSN_MAX_SUBSCRIPTIONS_PER_OWNER"):
        _subscribe(OWNER, "http://127.0.0.1:9/hoard/3")

    assert Subscription.objects.filter(owner=OWNER.owner).count() == 3
    # A duplicate allocates nothing and is still answered; another principal is not affected.
    assert _subscribe(OWNER, "http://127.0.0.1:9/hoard/0") == (made[0], False)
    assert _subscribe(OTHER, "http://127.0.0.1:9/hoard/3")[1] is True


@pytest.mark.django_db(transaction=True)
def test_a_principal_holds_at_most_the_pull_points_the_limit_allows(settings) -> None:
    from hpwsn import errors
    from subscriptions import services as subs
    from subscriptions.models import PullPoint

    settings.HPWSN_MAX_PULLPOINTS_PER_OWNER = 2
    first = subs.pull_point_create(base_url="http://testserver", principal=OWNER)
    subs.pull_point_create(base_url="http://testserver", principal=OWNER)

    with pytest.raises(errors.UnableToCreatePullPoint, match="HPWSN_MAX_PULLPOINTS_PER_OWNER"):
        subs.pull_point_create(base_url="http://testserver", principal=OWNER)

    assert PullPoint.objects.filter(owner=OWNER.owner).count() == 2
    subs.pull_point_create(base_url="http://testserver", principal=OTHER)
    subs.pull_point_destroy(pull_point_id=str(first.id))
    subs.pull_point_create(base_url="http://testserver", principal=OWNER)  # room again


@pytest.mark.django_db(transaction=True)
def test_a_principal_holds_at_most_the_registrations_the_limit_allows(settings) -> None:
    from hpwsn import errors
    from subscriptions.models import PublisherRegistration
    from subscriptions.registrations import registration_create
    from topics.services import topic_create

    topic_create(path="Hoard:Room")
    state.bump(state.VERSION_TOPICS)  # whatever tree an earlier test left in this process
    settings.HPWSN_MAX_REGISTRATIONS_PER_OWNER = 2

    def register(principal: Principal) -> object:
        return registration_create(
            publisher_address="http://127.0.0.1:9/publisher",
            topics=[TopicRef(text="Hoard:Room", dialect=None, nsmap={})],
            demand=False,
            initial_termination_time=None,
            base_url="http://testserver",
            principal=principal,
        )

    register(OWNER)
    register(OWNER)

    with pytest.raises(
        errors.PublisherRegistrationRejected, match="HPWSN_MAX_REGISTRATIONS_PER_OWNER"
    ):
        register(OWNER)

    assert PublisherRegistration.objects.filter(owner=OWNER.owner).count() == 2
    register(OTHER)


def _fragment(ident: str, flags: str, text: str) -> object:
    from lxml import etree

    from hpwsn import ns, wsn

    el = etree.fromstring(
        f'<wsnt:NotificationMessage xmlns:wsnt="{ns.WSNT}">'
        f'<wsnt:Topic Dialect="{ns.DIALECT_SIMPLE}">ALL</wsnt:Topic>'
        f"<wsnt:Package><Identification>{ident}</Identification><Fragment>{flags}</Fragment>"
        f"</wsnt:Package><wsnt:Message>{text}</wsnt:Message></wsnt:NotificationMessage>"
    )
    return wsn.parse_notification_message(el)


def test_incomplete_fragmented_messages_hold_at_most_the_bytes_the_limit_allows(settings):
    """In process, on the session's Redis: a fragment that would take the reassemblies held past
    HPWSN_MAX_REASSEMBLIES_BYTES is refused and kept out; one that fits once another reassembly
    has ended is accepted."""
    from dispatch import fragments
    from hpwsn import errors

    r = state.get_redis()
    token = uuid.uuid4().hex[:8]
    a, b, c = (f"{name}-{token}" for name in "abc")
    settings.HPWSN_MAX_REASSEMBLIES_BYTES = int(r.get(fragments.HELD) or 0) + 3000

    async def scenario() -> list[str]:
        seen = []
        hold = fragments.fragment_hold
        await hold(
            notification=_fragment(a, "1-1-0-0", "a" * 1000), topic_path="ALL", publisher=LOOPBACK
        )
        await hold(
            notification=_fragment(b, "1-1-0-0", "b" * 1000), topic_path="ALL", publisher=LOOPBACK
        )
        try:
            await hold(
                notification=_fragment(c, "1-1-0-0", "c" * 1500),
                topic_path="ALL",
                publisher=LOOPBACK,
            )
        except errors.InvalidFragment as exc:
            seen.append(str(exc))
        whole = await hold(
            notification=_fragment(a, "1-0-0-1", "a" * 500), topic_path="ALL", publisher=LOOPBACK
        )
        assert whole is not None
        await fragments.fragments_done([(LOOPBACK, "ALL", a)])
        await hold(
            notification=_fragment(c, "1-1-0-0", "c" * 1500), topic_path="ALL", publisher=LOOPBACK
        )
        return seen

    try:
        refusals = asyncio.run(scenario())
    finally:
        for ident in (a, b, c):
            key = fragments.reassembly_key(LOOPBACK, "ALL", ident)
            if r.zscore(fragments.DEADLINES, key) is not None:
                r.zadd(fragments.DEADLINES, {key: 0})
        fragments.fragments_expire()

    assert len(refusals) == 1
    assert "HPWSN_MAX_REASSEMBLIES_BYTES" in refusals[0]
    assert settings.HPWSN_MAX_REASSEMBLIES_BYTES - int(r.get(fragments.HELD) or 0) == 3000


@pytest.mark.parametrize(
    "when", ["9999-12-31T23:59:59-14:00", "9999-12-31T23:00:00-01:00"], ids=["-14h", "-1h"]
)
def test_a_termination_time_past_the_last_representable_instant_is_refused(
    platform, consumer_factory, db_access, when
):
    from subscriptions.models import Subscription

    consumer = consumer_factory()
    before = Subscription.objects.count()

    res = soap_call(platform.endpoint, subscribe_xml(consumer.url, "ALL1", termination=when))

    assert res.fault_name == "UnacceptableInitialTerminationTimeFault", res.body[:2000]
    assert Subscription.objects.count() == before
    # The broker goes on subscribing and delivering.
    assert soap_call(platform.endpoint, subscribe_xml(consumer.url, "ALL1")).status == 200
    assert (
        soap_call(platform.endpoint, notify_xml(("ALL1", "<t xmlns='urn:t'>on</t>"))).status == 202
    )
    assert consumer.wait_for(1)


SQL_DIALECT = "urn:hpwsn:2026:filter:sql"


@pytest.mark.parametrize(
    ("condition", "value"),
    [
        # As one regular expression (.*a.*a...b) this took 30 s on 80 characters.
        ("v LIKE '%a%a%a%a%a%a%b'", "a" * 2000),
        # The full table of distances: 200,000 x 5,000 steps.
        (f"strlike(v, '{'y' * 5000}', 1000000)", "x" * 200_000),
    ],
    ids=["like-backtracking", "strlike-table"],
)
def test_a_costly_sql_like_filter_never_holds_up_another_subscribers_delivery(
    platform, consumer_factory, committed, condition, value
):
    token = uuid.uuid4().hex[:8]
    costly, plain = f"Costly{token}", f"Plain{token}"
    committed(topic_with_policy, costly, **ANONYMOUS_ALLOWED)
    committed(topic_with_policy, plain, **ANONYMOUS_ALLOWED)
    filtering, other = consumer_factory(), consumer_factory()
    content = f'<wsnt:MessageContent Dialect="{SQL_DIALECT}">{condition}</wsnt:MessageContent>'
    res = soap_call(platform.endpoint, subscribe_xml(filtering.url, costly, extra=content))
    assert res.status == 200, res.body[:2000]
    assert soap_call(platform.endpoint, subscribe_xml(other.url, plain)).status == 200

    assert soap_call(platform.endpoint, notify_xml((costly, f"<v>{value}</v>"))).status == 202
    assert (
        soap_call(platform.endpoint, notify_xml((plain, "<t xmlns='urn:t'>on</t>"))).status == 202
    )

    assert other.wait_for(1, timeout=30)
    assert filtering.received == []  # neither value matches its filter
