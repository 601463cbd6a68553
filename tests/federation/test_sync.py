"""The sync round: one at a time per site."""

from __future__ import annotations

import json
import time

import pytest

from federation.peers import peers_parse
from federation.services import federation_sync
from hpwsn import ns
from hpwsn_site import state

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def unreachable_peer(settings):  # type: ignore[no-untyped-def]
    # Nothing listens on port 9: a round records the failure in the site registry.
    settings.HPWSN_SITE_NAME = "a"
    settings.HPWSN_FEDERATION_PEERS = peers_parse("b=http://127.0.0.1:9", own="a")
    r = state.get_redis()
    r.delete(state.FEDERATION_PEERS, state.FEDERATION_SYNC_LOCK)
    yield r
    r.delete(state.FEDERATION_PEERS, state.FEDERATION_SYNC_LOCK)


def test_a_round_does_nothing_while_another_runs_and_runs_once_it_is_done(unreachable_peer):
    r = unreachable_peer
    r.set(state.FEDERATION_SYNC_LOCK, "another round", px=60_000)
    assert federation_sync() == {}
    assert r.hget(state.FEDERATION_PEERS, "b") is None

    r.delete(state.FEDERATION_SYNC_LOCK)
    errors = federation_sync()
    assert set(errors) == {"b"}
    assert "127.0.0.1:9" in json.loads(r.hget(state.FEDERATION_PEERS, "b"))["last_error"]
    # The round let go of its lock.
    assert r.get(state.FEDERATION_SYNC_LOCK) is None


@pytest.fixture
def peer_here(settings, live_server):  # type: ignore[no-untyped-def]
    """This site is a; its peer b is this very server (its links are subscriptions here)."""
    from topics.services import topics_load_demo

    topics_load_demo()
    settings.HPWSN_SITE_NAME = "a"
    settings.HPWSN_FEDERATION_URL = "http://127.0.0.2:9"
    return f"b={live_server.url}"


def _link_filters() -> list[tuple[str, str]]:
    """(topic path, ProducerProperties filter) of each link held here (by a, at b)."""
    from subscriptions.models import Subscription

    return list(
        Subscription.objects.filter(consumer_address__contains="/federation/in/").values_list(
            "topic_path", "producer_filter"
        )
    )


def test_a_link_refuses_at_the_peer_what_this_sites_other_peers_publish(peer_here, settings):
    from federation.models import Link
    from federation.peers import link_filter
    from federation.services import federation_peer_sync

    settings.HPWSN_FEDERATION_PEERS = peers_parse(
        f"{peer_here},c=http://127.0.0.1:9,d=http://127.0.0.1:9", own="a"
    )
    b = settings.HPWSN_FEDERATION_PEERS[0]
    done = federation_peer_sync(peer=b, interest={"ALL1": ("a",)}, now=time.time())
    assert (done.linked, done.refused) == (["ALL1"], {})
    assert _link_filters() == [("ALL1", link_filter("a", others=["c", "d"]))]
    first = Link.objects.get(peer="b").reference

    # d leaves the federation: the link is made again without it, and the old one ended.
    settings.HPWSN_FEDERATION_PEERS = peers_parse(f"{peer_here},c=http://127.0.0.1:9", own="a")
    federation_peer_sync(peer=b, interest={"ALL1": ("a",)}, now=time.time())
    assert _link_filters() == [("ALL1", link_filter("a", others=["c"]))]
    assert Link.objects.get(peer="b").reference != first
    # Nothing changed: the link stands as it is.
    again = Link.objects.get(peer="b").reference
    federation_peer_sync(peer=b, interest={"ALL1": ("a",)}, now=time.time())
    assert Link.objects.get(peer="b").reference == again


def test_a_link_names_the_sites_other_peers_and_has_its_pushes_signed(peer_here, settings):
    """The peer learns which sites this one asks itself (it relays none of this site's interest
    to them) and signs every push of the link with a secret only this site can make."""
    from federation.peers import link_signing_secret
    from federation.services import federation_peer_sync
    from subscriptions.models import Subscription

    settings.HPWSN_FEDERATION_PEERS = peers_parse(
        f"{peer_here},c=http://127.0.0.1:9,d=http://127.0.0.1:9", own="a"
    )
    b = settings.HPWSN_FEDERATION_PEERS[0]
    federation_peer_sync(peer=b, interest={"ALL1": ("a",)}, now=time.time())
    (link,) = Subscription.objects.filter(consumer_address__contains="/federation/in/")
    assert link.site_peers == ["c", "d"]
    assert link.signing_secret == link_signing_secret(settings.SECRET_KEY, "b")
    assert link.signing_secret != link_signing_secret(settings.SECRET_KEY, "c")


def test_a_link_made_before_signed_pushes_is_made_again_signed(peer_here, settings):
    """Its pushes come unsigned, which this site refuses: the next round makes it again (the new
    one first) and ends the old one at the peer."""
    from federation.models import Link
    from federation.services import federation_peer_sync
    from subscriptions.models import Subscription
    from subscriptions.services import subscription_dedup_key

    settings.HPWSN_FEDERATION_PEERS = peers_parse(peer_here, own="a")
    b = settings.HPWSN_FEDERATION_PEERS[0]
    federation_peer_sync(peer=b, interest={"ALL1": ("a",)}, now=time.time())
    # As a version before signing left it: the link, and its subscription at the peer unsigned.
    Link.objects.filter(peer="b").update(signed=False)
    old = Link.objects.get(peer="b").reference
    (at_peer,) = Subscription.objects.filter(consumer_address__contains="/federation/in/")
    unsigned_key = subscription_dedup_key(
        owner=at_peer.owner,
        mode=at_peer.mode,
        target=at_peer.consumer_address,
        canonical=at_peer.topic_path,
        content_dialect=at_peer.content_dialect,
        content_filter=at_peer.content_filter,
        producer_filter=at_peer.producer_filter,
        interest_path=at_peer.interest_path,
    )
    Subscription.objects.filter(pk=at_peer.pk).update(signing_secret="", dedup_key=unsigned_key)

    federation_peer_sync(peer=b, interest={"ALL1": ("a",)}, now=time.time())

    link = Link.objects.get(peer="b")
    assert link.signed
    assert link.reference != old
    (at_peer,) = Subscription.objects.filter(consumer_address__contains="/federation/in/")
    assert at_peer.reference_address == link.reference
    assert at_peer.signing_secret


def test_a_wildcard_subscriber_links_every_root_and_a_root_the_peer_refuses_spares_the_rest(
    peer_here, settings
):
    from federation.models import Link
    from hpwsn.wsn import TopicRef
    from subscriptions.services import subscription_create
    from topics.acl import Principal
    from topics.models import Topic
    from topics.services import topic_update

    settings.HPWSN_FEDERATION_PEERS = peers_parse(peer_here, own="a")
    subscription_create(
        consumer_address="http://127.0.0.1:9/own",
        topic=TopicRef(text="//ALARM1", dialect=ns.DIALECT_FULL, nsmap={}),
        content=None,
        initial_termination_time=None,
        soap_version="1.1",
        use_raw=False,
        base_url="http://testserver",
        principal=Principal(name="admin1", groups=frozenset({"hpwsn-admins"})),
    )
    # The peer (this very server) does not let anonymous callers, its links, subscribe at ALL,
    # the first root asked for.
    closed = Topic.objects.get(path="ALL")
    topic_update(topic_id=closed.pk, changes={"anonymous_subscribe": False})
    r = state.get_redis()
    r.delete(state.FEDERATION_PEERS, state.FEDERATION_SYNC_LOCK)

    errors = federation_sync()

    roots = ["ALL1", "ALL2", "ALL3", "Object"]
    assert sorted(Link.objects.values_list("topic_path", flat=True)) == roots
    assert sorted(t for t, _f in _link_filters()) == roots
    rec = json.loads(r.hget(state.FEDERATION_PEERS, "b"))
    assert rec["links"] == roots
    assert rec["last_ok"] is not None
    assert rec["last_error"].startswith("ALL refused: ")
    assert "may not subscribe" in rec["last_error"]
    assert set(errors) == {"b"}
    r.delete(state.FEDERATION_PEERS)
