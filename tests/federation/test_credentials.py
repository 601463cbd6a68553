"""Links made with this site's account at a peer, and forwarded notifications published as the peer.

The peer is this very server (a live server on the real slapd of `ldap_directory`): the links this
site makes there are subscriptions here, owned by whoever made them.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
from django.test import Client

from dispatch.models import StoredMessage
from federation.models import Link
from federation.peers import Credentials, inbound_token, peers_parse
from federation.services import federation_peer_sync, federation_sync
from hpwsn import ns
from hpwsn_site import state
from subscriptions.models import Subscription
from tests.directory.helpers import soap_as
from tests.federation.helpers import peer_post
from tests.support import notify_xml, soap_call

pytestmark = pytest.mark.django_db(transaction=True)

RENEW = "<wsnt:Renew><wsnt:TerminationTime>PT2H</wsnt:TerminationTime></wsnt:Renew>"


@pytest.fixture
def peer_b(settings, live_server, ldap_directory):  # type: ignore[no-untyped-def]
    """This site is a; its peer b is this very server, checking credentials against slapd."""
    from topics.services import topics_load_demo

    topics_load_demo()
    settings.HPWSN_SITE_NAME = "a"
    settings.HPWSN_FEDERATION_URL = "http://127.0.0.2:9"
    settings.HPWSN_FEDERATION_PEERS = peers_parse(f"b={live_server.url}", own="a")
    r = state.get_redis()
    r.delete(state.FEDERATION_PEERS, state.FEDERATION_SYNC_LOCK)
    yield settings.HPWSN_FEDERATION_PEERS[0]
    r.delete(state.FEDERATION_PEERS, state.FEDERATION_SYNC_LOCK)


def _links_at_peer() -> list[Subscription]:
    return list(Subscription.objects.filter(consumer_address__contains="/federation/in/"))


def test_a_link_made_with_credentials_is_that_accounts_and_only_this_site_may_renew_it(
    peer_b, settings, ldap_directory
):
    password = ldap_directory.demo_password("subscriber1")
    settings.HPWSN_FEDERATION_CREDENTIALS = {"b": Credentials("subscriber1", password)}
    now = time.time()
    done = federation_peer_sync(peer=peer_b, interest={"ALL1": ("a",)}, now=now)
    assert (done.linked, done.refused) == (["ALL1"], {})

    (at_peer,) = _links_at_peer()
    assert at_peer.owner == "user:subscriber1"
    link = Link.objects.get(peer="b")
    assert link.user == "subscriber1"
    assert link.reference == at_peer.reference_address

    # Another account, and an anonymous caller, may not renew (nor end) it.
    other = soap_as(
        link.reference, RENEW, auth=("publisher1", ldap_directory.demo_password("publisher1"))
    )
    assert other.fault_name == "NotAuthorized", other.body
    anonymous = soap_call(link.reference, "<wsnt:Unsubscribe/>", to=link.reference)
    assert anonymous.fault_name == "NotAuthorized", anonymous.body
    before = Subscription.objects.get(pk=at_peer.pk).termination_time

    # This site renews it with its account, past half its life: the same link, later end.
    later = now + settings.HPWSN_FEDERATION_LINK_TTL_S * 0.75
    federation_peer_sync(peer=peer_b, interest={"ALL1": ("a",)}, now=later)
    assert Link.objects.get(peer="b").reference == link.reference
    renewed = Subscription.objects.get(pk=at_peer.pk).termination_time
    assert before is not None
    assert renewed is not None
    assert renewed > before


def test_a_link_is_made_again_when_this_sites_account_at_the_peer_changes(
    peer_b, settings, ldap_directory
):
    federation_peer_sync(peer=peer_b, interest={"ALL1": ("a",)}, now=time.time())
    (anonymous,) = _links_at_peer()
    assert anonymous.owner == "anonymous"

    password = ldap_directory.demo_password("subscriber1")
    settings.HPWSN_FEDERATION_CREDENTIALS = {"b": Credentials("subscriber1", password)}
    federation_peer_sync(peer=peer_b, interest={"ALL1": ("a",)}, now=time.time())
    # The new link is the account's; the anonymous one was ended (anyone may end it).
    assert [s.owner for s in _links_at_peer()] == ["user:subscriber1"]
    assert Link.objects.get(peer="b").user == "subscriber1"


def test_wrong_credentials_are_the_peers_last_error_and_make_no_link(peer_b, settings):
    settings.HPWSN_FEDERATION_CREDENTIALS = {"b": Credentials("subscriber1", "not-its-password")}
    own = (
        f'<wsnt:Subscribe xmlns:wsnt="{ns.WSNT}" xmlns:wsa="{ns.WSA}"><wsnt:ConsumerReference>'
        "<wsa:Address>http://127.0.0.1:9/own</wsa:Address></wsnt:ConsumerReference><wsnt:Filter>"
        f'<wsnt:TopicExpression Dialect="{ns.DIALECT_COLON}">ALL1</wsnt:TopicExpression>'
        "</wsnt:Filter></wsnt:Subscribe>"
    )
    assert soap_call(f"{peer_b.url}/wsn/", own).status == 200

    errors = federation_sync()

    rec = json.loads(state.get_redis().hget(state.FEDERATION_PEERS, "b"))
    assert set(errors) == {"b"}
    assert rec["last_error"].startswith("ALL1 refused: ")
    assert "HTTP 401 wsse:FailedAuthentication" in rec["last_error"]
    assert "authentication failed for 'subscriber1'" in rec["last_error"]
    assert rec["links"] == []
    assert not Link.objects.exists()
    assert not _links_at_peer()


@pytest.fixture
def federation_only_topic(settings):  # type: ignore[no-untyped-def]
    """A root `Fed` whose policy lets only the federation group publish (no anonymous callers);
    this site is a, with peer b: b's inbound path here."""
    from topics.models import Topic
    from topics.services import topic_create, topic_update

    topic_create(path="Fed:Alarm")
    root = Topic.objects.get(path="Fed")
    topic_update(
        topic_id=root.pk,
        changes={"publish_groups": "federation", "anonymous_publish": False},
    )
    settings.HPWSN_SITE_NAME = "a"
    settings.HPWSN_FEDERATION_PEERS = peers_parse("b=http://127.0.0.1:9", own="a")
    # This site's link at b for Fed: b may push its subtree here.
    Link.objects.create(
        peer="b",
        topic_path="Fed",
        reference="http://127.0.0.1:9/wsn/subscriptions/1",
        expires_at=time.time() + 300,
        interest_path=["a"],
        signed=True,
    )
    return f"/federation/in/b/{inbound_token(settings.SECRET_KEY, 'b')}/"


def _forwarded(topic: str, push_id: str) -> bytes:
    return (
        f'<s:Envelope xmlns:s="{ns.SOAP11}" xmlns:wsnt="{ns.WSNT}" xmlns:wsa="{ns.WSA}" '
        f'xmlns:hpwsn="{ns.HPWSN}"><s:Header><wsa:MessageID>urn:uuid:{uuid.uuid4()}'
        "</wsa:MessageID></s:Header><s:Body><wsnt:Notify><wsnt:NotificationMessage>"
        f'<wsnt:Topic Dialect="{ns.DIALECT_COLON}">{topic}</wsnt:Topic>'
        f"<wsnt:Message><n>{push_id}</n></wsnt:Message></wsnt:NotificationMessage>"
        f"<hpwsn:MessageIds><hpwsn:Id>{push_id}</hpwsn:Id></hpwsn:MessageIds>"
        "</wsnt:Notify></s:Body></s:Envelope>"
    ).encode()


def test_a_topic_open_to_the_federation_group_takes_forwarded_notifications_not_anonymous_ones(
    federation_only_topic,
):
    client = Client()
    push_id = uuid.uuid4().hex
    res = peer_post(federation_only_topic, _forwarded("Fed:Alarm", push_id))
    assert res.status_code == 202, res.content
    (stored,) = StoredMessage.objects.all()
    assert push_id.encode() in bytes(stored.payload)

    anonymous = client.post(
        "/wsn/",
        data=(
            f'<s:Envelope xmlns:s="{ns.SOAP11}" xmlns:wsnt="{ns.WSNT}" xmlns:wsa="{ns.WSA}">'
            f"<s:Body>{notify_xml(('Fed:Alarm', '<n>anonymous</n>'))}</s:Body></s:Envelope>"
        ).encode(),
        content_type="text/xml; charset=utf-8",
    )
    assert anonymous.status_code == 500
    assert b"NotAuthorized" in anonymous.content
    assert StoredMessage.objects.count() == 1


def test_a_topic_not_open_to_the_federation_group_refuses_forwarded_notifications(
    federation_only_topic, settings
):
    # The group this site publishes forwarded notifications in is another one.
    settings.HPWSN_FEDERATION_GROUP = "other-sites"
    res = peer_post(federation_only_topic, _forwarded("Fed:Alarm", uuid.uuid4().hex))
    assert res.status_code == 500
    assert b"NotAuthorized" in res.content
    assert b"site:b" in res.content
    assert not StoredMessage.objects.exists()
