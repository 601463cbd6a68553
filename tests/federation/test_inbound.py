"""The inbound edge: what a peer pushes is stored once, marked with its origin; the rest refused."""

from __future__ import annotations

import uuid

import pytest
from django.test import Client

from dispatch.models import StoredMessage
from federation.peers import inbound_token, origin_producer, peers_parse
from hpwsn import ns

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def peer_b(settings):  # type: ignore[no-untyped-def]
    from topics.services import topics_load_demo

    topics_load_demo()
    settings.HPWSN_FEDERATION_PEERS = peers_parse("b=http://127.0.0.1:9", own="a")
    return f"/federation/in/b/{inbound_token(settings.SECRET_KEY, 'b')}/"


def _envelope(body: str) -> bytes:
    return (
        f'<s:Envelope xmlns:s="{ns.SOAP11}" xmlns:wsnt="{ns.WSNT}" xmlns:wsa="{ns.WSA}" '
        f'xmlns:hpwsn="{ns.HPWSN}"><s:Header><wsa:MessageID>urn:uuid:1</wsa:MessageID>'
        f"</s:Header><s:Body>{body}</s:Body></s:Envelope>"
    ).encode()


def _push(ids: list[str]) -> bytes:
    messages = "".join(
        f'<wsnt:NotificationMessage><wsnt:Topic Dialect="{ns.DIALECT_COLON}">ALL1</wsnt:Topic>'
        f"<wsnt:Message><n>{i}</n></wsnt:Message></wsnt:NotificationMessage>"
        for i in ids
    )
    listed = "".join(f"<hpwsn:Id>{i}</hpwsn:Id>" for i in ids)
    return _envelope(
        f"<wsnt:Notify>{messages}<hpwsn:MessageIds>{listed}</hpwsn:MessageIds></wsnt:Notify>"
    )


def _post(path: str, data: bytes):  # type: ignore[no-untyped-def]
    return Client().post(path, data=data, content_type="text/xml; charset=utf-8")


def _ids(n: int) -> list[str]:
    # Origin ids of the test's own: what was stored is remembered in Redis across tests.
    return [uuid.uuid4().hex for _ in range(n)]


def test_a_forwarded_notification_is_stored_once_with_its_origin_however_often_it_comes(peer_b):
    ids = _ids(2)
    assert _post(peer_b, _push(ids)).status_code == 202
    # The peer's pump pushes the batch again (its answer was lost): nothing new is stored.
    assert _post(peer_b, _push(ids)).status_code == 202

    rows = list(StoredMessage.objects.order_by("seq"))
    assert len(rows) == 2
    assert origin_producer("b", ids[0]).encode() in bytes(rows[0].payload)
    assert origin_producer("b", ids[1]).encode() in bytes(rows[1].payload)


def test_a_batch_cut_differently_on_redelivery_stores_only_what_is_new(peer_b):
    ids = _ids(2)
    assert _post(peer_b, _push(ids[:1])).status_code == 202
    # The sender's retry read a longer batch from its queue: the first again, and a second.
    assert _post(peer_b, _push(ids)).status_code == 202

    rows = [bytes(r.payload) for r in StoredMessage.objects.order_by("seq")]
    assert len(rows) == 2
    assert origin_producer("b", ids[0]).encode() in rows[0]
    assert origin_producer("b", ids[1]).encode() in rows[1]


def test_it_refuses_a_push_to_an_address_it_did_not_give(peer_b, settings):
    wrong_token = peer_b.replace(inbound_token(settings.SECRET_KEY, "b"), "0" * 40)
    assert _post(wrong_token, _push(["id-1"])).status_code == 404
    unknown_peer = f"/federation/in/z/{inbound_token(settings.SECRET_KEY, 'z')}/"
    assert _post(unknown_peer, _push(["id-1"])).status_code == 404
    assert Client().get(peer_b).status_code == 405
    assert not StoredMessage.objects.exists()


def test_it_answers_a_fault_to_anything_but_a_notify(peer_b):
    res = _post(peer_b, _envelope("<wsnt:Subscribe/>"))
    assert res.status_code == 500
    assert b"is not a wsnt:Notify" in res.content
    res = _post(peer_b, b"<not-soap")
    assert res.status_code in (400, 500)
    assert b"Fault" in res.content


def test_a_topic_unknown_here_is_refused_with_the_wsn_fault(peer_b):
    body = _push(["id-9"]).replace(b">ALL1<", b">NOSUCH:TOPIC<")
    res = _post(peer_b, body)
    assert res.status_code >= 400
    assert b"TopicNotSupported" in res.content or b"not in the topic tree" in res.content
    assert not StoredMessage.objects.exists()
