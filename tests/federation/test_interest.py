"""Interest with its path: a peer's link states it, this site keeps it and relays it on."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from federation.peers import MAX_PATH, Interest, inbound_url
from federation.selectors import interest_held
from hpwsn import ns
from subscriptions.models import Subscription

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def demo_topics():  # type: ignore[no-untyped-def]
    from topics.services import topics_load_demo

    topics_load_demo()


def _subscribe(  # type: ignore[no-untyped-def]
    consumer: str,
    topic: str,
    sites: list[str] | None = None,
    dialect: str = ns.DIALECT_COLON,
    peers: list[str] | None = None,
):
    policy = ""
    if sites is not None:
        listed = "".join(f"<hpwsn:Site>{s}</hpwsn:Site>" for s in sites)
        policy = f"<hpwsn:InterestPath>{listed}</hpwsn:InterestPath>"
    if peers is not None:
        listed = "".join(f"<hpwsn:Site>{s}</hpwsn:Site>" for s in peers)
        policy += f"<hpwsn:Peers>{listed}</hpwsn:Peers>"
    if policy:
        policy = f"<wsnt:SubscriptionPolicy>{policy}</wsnt:SubscriptionPolicy>"
    body = (
        f'<s:Envelope xmlns:s="{ns.SOAP11}" xmlns:wsnt="{ns.WSNT}" xmlns:wsa="{ns.WSA}" '
        f'xmlns:hpwsn="{ns.HPWSN}"><s:Header><wsa:MessageID>urn:uuid:{uuid.uuid4()}'
        "</wsa:MessageID></s:Header><s:Body><wsnt:Subscribe><wsnt:ConsumerReference>"
        f"<wsa:Address>{consumer}</wsa:Address></wsnt:ConsumerReference><wsnt:Filter>"
        f'<wsnt:TopicExpression Dialect="{dialect}">{topic}</wsnt:TopicExpression>'
        f"</wsnt:Filter>{policy}</wsnt:Subscribe></s:Body></s:Envelope>"
    ).encode()
    return Client().post("/wsn/", data=body, content_type="text/xml; charset=utf-8")


def _link_consumer(peer: str) -> str:
    """The inbound address a peer's link names (its site's, for this site as `peer`)."""
    return inbound_url(f"http://127.0.0.{1 + len(peer)}:9", peer, "its-secret")


def test_a_link_keeps_the_interest_path_it_states():
    res = _subscribe(_link_consumer("a"), "ALL1", ["d", "c"])
    assert res.status_code == 200, res.content
    (sub,) = Subscription.objects.all()
    assert sub.interest_path == ["d", "c"]


@pytest.mark.parametrize(
    ("sites", "error"),
    [
        ([], b"names at least one site"),
        (["c", "C"], b"site name"),
        (["c", "d", "c"], b"names a site twice"),
        ([f"s{i}" for i in range(MAX_PATH + 1)], f"at most {MAX_PATH} sites".encode()),
    ],
)
def test_a_bad_interest_path_is_refused_with_a_precise_fault(sites, error):
    res = _subscribe(_link_consumer("a"), "ALL1", sites)
    assert res.status_code >= 400
    assert b"hpwsn:InterestPath refused" in res.content
    assert error in res.content
    assert not Subscription.objects.exists()


def test_a_link_states_its_sites_other_peers_and_they_are_kept_with_its_interest():
    res = _subscribe(_link_consumer("a"), "ALL1", ["c"], peers=["d", "e"])
    assert res.status_code == 200, res.content
    (sub,) = Subscription.objects.all()
    assert sub.site_peers == ["d", "e"]
    assert interest_held() == [Interest("ALL1", ("c",), peers=("d", "e"))]


@pytest.mark.parametrize(
    ("peers", "error"),
    [(["d", "D"], b"site name"), (["d", "d"], b"names a site twice")],
)
def test_a_bad_peer_list_is_refused_with_a_precise_fault(peers, error):
    res = _subscribe(_link_consumer("a"), "ALL1", ["c"], peers=peers)
    assert res.status_code >= 400
    assert b"hpwsn:Peers refused" in res.content
    assert error in res.content
    assert not Subscription.objects.exists()


def test_a_link_stating_another_path_is_another_subscription_and_the_same_path_the_same():
    consumer = _link_consumer("a")
    for sites in (["c"], ["d", "c"], ["c"]):
        assert _subscribe(consumer, "ALL1", sites).status_code == 200
    paths = sorted(Subscription.objects.values_list("interest_path", flat=True))
    assert paths == [["c"], ["d", "c"]]


def test_interest_held_is_this_sites_subscribers_and_its_peers_links_with_their_paths():
    assert _subscribe("http://127.0.0.1:9/own", "ALL:ALARM").status_code == 200
    assert _subscribe(_link_consumer("a"), "ALL1", ["d", "c"]).status_code == 200
    # A link made by a site that does not relay states no path: not relayed on.
    assert _subscribe(_link_consumer("bb"), "ALL2").status_code == 200

    assert interest_held() == [
        Interest("ALL1", ("d", "c")),
        Interest("ALL:ALARM", ()),
    ]


def test_wildcard_subscribers_here_want_the_subtrees_their_patterns_lie_in():
    own = "http://127.0.0.1:9/own"
    for topic in ("ALL//ALARM1", "ALL/ALARM/*", "Object/*|ALL2"):
        assert _subscribe(own, topic, dialect=ns.DIALECT_FULL).status_code == 200
    assert _subscribe(own + "2", "ALL//ALARM1", dialect=ns.DIALECT_FULL).status_code == 200
    assert interest_held() == [
        Interest("ALL", ()),
        Interest("ALL2", ()),
        Interest("ALL:ALARM", ()),
        Interest("Object", ()),
    ]


def _subscribe_as_admin(topic: str | None) -> Subscription:
    """Patterns that may select any root need a principal the top of the tree admits."""
    from hpwsn.wsn import TopicRef
    from subscriptions.services import subscription_create
    from topics.acl import Principal

    sub, _created = subscription_create(
        consumer_address="http://127.0.0.1:9/own",
        topic=None if topic is None else TopicRef(text=topic, dialect=ns.DIALECT_FULL, nsmap={}),
        content=None,
        initial_termination_time=None,
        soap_version="1.1",
        use_raw=False,
        base_url="http://testserver",
        principal=Principal(name="admin1", groups=frozenset({"hpwsn-admins"})),
    )
    return sub


@pytest.mark.parametrize("topic", ["*", "//ALARM1", "*/ALARM"])
def test_a_wildcard_with_no_concrete_first_step_wants_every_root(topic):
    _subscribe_as_admin(topic)
    roots = ["ALL", "ALL1", "ALL2", "ALL3", "Object"]
    assert interest_held() == [Interest(root, ()) for root in roots]


def test_a_subscription_without_a_topic_expression_wants_every_root_until_it_ends():
    sub = _subscribe_as_admin(None)
    assert [i.topic for i in interest_held()] == ["ALL", "ALL1", "ALL2", "ALL3", "Object"]
    Subscription.objects.filter(pk=sub.pk).update(
        termination_time=timezone.now() - timedelta(seconds=1)
    )
    assert interest_held() == []


def test_an_interest_path_survives_a_restore_from_the_directory():
    from directory.selectors import subscription_view_of
    from directory.services import subscription_restore

    assert _subscribe(_link_consumer("a"), "ALL1", ["d", "c"]).status_code == 200
    sub = Subscription.objects.get()
    view = subscription_view_of(sub)
    sub.delete()

    restored = subscription_restore(view=view)
    assert restored.interest_path == ["d", "c"]
    assert restored.dedup_key == sub.dedup_key
    assert interest_held() == [Interest("ALL1", ("d", "c"))]
