"""The inbound edge: what a peer pushes is stored once, marked with its path; the rest refused."""

from __future__ import annotations

import time
import uuid

import pytest
from django.test import Client

from dispatch.models import StoredMessage
from dispatch.push import signature_headers
from federation.peers import (
    inbound_token,
    link_signing_secret,
    origin_producer,
    peers_parse,
)
from hpwsn import ns
from tests.federation.helpers import peer_post

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def peers(settings):  # type: ignore[no-untyped-def]
    """This site is a; b and c are its peers: their inbound paths."""
    from topics.services import topics_load_demo

    topics_load_demo()
    settings.HPWSN_SITE_NAME = "a"
    settings.HPWSN_FEDERATION_PEERS = peers_parse(
        "b=http://127.0.0.1:9,c=http://127.0.0.1:9", own="a"
    )
    return {p: f"/federation/in/{p}/{inbound_token(settings.SECRET_KEY, p)}/" for p in "bc"}


@pytest.fixture
def peer_b(peers):  # type: ignore[no-untyped-def]
    return peers["b"]


def _envelope(body: str) -> bytes:
    return (
        f'<s:Envelope xmlns:s="{ns.SOAP11}" xmlns:wsnt="{ns.WSNT}" xmlns:wsa="{ns.WSA}" '
        f'xmlns:hpwsn="{ns.HPWSN}"><s:Header><wsa:MessageID>urn:uuid:1</wsa:MessageID>'
        f"</s:Header><s:Body>{body}</s:Body></s:Envelope>"
    ).encode()


def _producer(address: str) -> str:
    return f"<wsnt:ProducerReference><wsa:Address>{address}</wsa:Address></wsnt:ProducerReference>"


def _push(ids: list[str], *, producers: list[str] | None = None, texts: list[str] | None = None):  # type: ignore[no-untyped-def]
    """A peer's Notify: messages with these push ids (their text the id unless given), each
    with a ProducerReference when given."""
    producers = producers or [""] * len(ids)
    texts = texts or ids
    messages = "".join(
        f'<wsnt:NotificationMessage><wsnt:Topic Dialect="{ns.DIALECT_COLON}">ALL1</wsnt:Topic>'
        f"{_producer(p) if p else ''}<wsnt:Message><n>{t}</n></wsnt:Message>"
        "</wsnt:NotificationMessage>"
        for t, p in zip(texts, producers, strict=True)
    )
    listed = "".join(f"<hpwsn:Id>{i}</hpwsn:Id>" for i in ids)
    return _envelope(
        f"<wsnt:Notify>{messages}<hpwsn:MessageIds>{listed}</hpwsn:MessageIds></wsnt:Notify>"
    )


def _ids(n: int) -> list[str]:
    # Origin ids of the test's own: what was stored is remembered in Redis across tests.
    return [uuid.uuid4().hex for _ in range(n)]


def test_a_forwarded_notification_is_stored_once_with_its_path_however_often_it_comes(peer_b):
    ids = _ids(2)
    assert peer_post(peer_b, _push(ids)).status_code == 202
    # The peer's pump pushes the batch again (its answer was lost): nothing new is stored.
    assert peer_post(peer_b, _push(ids)).status_code == 202

    rows = list(StoredMessage.objects.order_by("seq"))
    assert len(rows) == 2
    assert origin_producer(("b", "a"), ids[0]).encode() in bytes(rows[0].payload)
    assert origin_producer(("b", "a"), ids[1]).encode() in bytes(rows[1].payload)


def test_a_batch_cut_differently_on_redelivery_stores_only_what_is_new(peer_b):
    ids = _ids(2)
    assert peer_post(peer_b, _push(ids[:1])).status_code == 202
    # The sender's retry read a longer batch from its queue: the first again, and a second.
    assert peer_post(peer_b, _push(ids)).status_code == 202

    rows = [bytes(r.payload) for r in StoredMessage.objects.order_by("seq")]
    assert len(rows) == 2
    assert origin_producer(("b", "a"), ids[0]).encode() in rows[0]
    assert origin_producer(("b", "a"), ids[1]).encode() in rows[1]


def test_with_a_single_peer_a_retry_cut_differently_is_stored_once_too(peer_b, settings):
    # One peer: one way in, so no origin is claimed (nothing can come by another way).
    settings.HPWSN_FEDERATION_PEERS = peers_parse("b=http://127.0.0.1:9", own="a")
    ids = _ids(3)
    assert peer_post(peer_b, _push(ids[:2])).status_code == 202
    assert peer_post(peer_b, _push(ids)).status_code == 202
    assert peer_post(peer_b, _push(ids)).status_code == 202

    rows = _stored()
    assert len(rows) == 3
    for row, nid in zip(rows, ids, strict=True):
        assert origin_producer(("b", "a"), nid).encode() in row


def test_it_refuses_a_push_to_an_address_it_did_not_give(peer_b, settings):
    wrong_token = peer_b.replace(inbound_token(settings.SECRET_KEY, "b"), "0" * 40)
    assert peer_post(wrong_token, _push(["id-1"])).status_code == 404
    unknown_peer = f"/federation/in/z/{inbound_token(settings.SECRET_KEY, 'z')}/"
    assert peer_post(unknown_peer, _push(["id-1"])).status_code == 404
    assert Client().get(peer_b).status_code == 405
    assert not StoredMessage.objects.exists()


def test_it_refuses_a_push_not_signed_by_the_peer_the_address_names(peer_b, peers, settings):
    """The address alone is not enough: a push must carry the Standard Webhooks signature made
    with the SigningSecret this site gave its links at that peer, made within five minutes."""
    ids = _ids(1)
    unsigned = peer_post(peer_b, _push(ids), secret="")
    assert unsigned.status_code == 401
    assert b"not signed" in unsigned.content
    # Signed with another peer's secret, with a secret of the sender's choosing, or long ago.
    other = link_signing_secret(settings.SECRET_KEY, "c")
    assert peer_post(peer_b, _push(ids), secret=other).status_code == 401
    assert peer_post(peer_b, _push(ids), secret="whsec_" + "A" * 44).status_code == 401
    assert peer_post(peer_b, _push(ids), at=time.time() - 600).status_code == 401
    # A body changed after it was signed.
    secret = link_signing_secret(settings.SECRET_KEY, "b")
    signed = signature_headers(secret, "msg_1", _push(ids))
    headers = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in signed.items()}
    forged = Client().post(
        peer_b, data=_push(_ids(1)), content_type="text/xml; charset=utf-8", **headers
    )
    assert forged.status_code == 401
    # Headers no signer writes: a clear 401, never an error.
    for hostile in (
        {**headers, "HTTP_WEBHOOK_SIGNATURE": "v1,\u00e9\u00e9"},
        {**headers, "HTTP_WEBHOOK_TIMESTAMP": "\u00b2\u00b3"},
        {**headers, "HTTP_WEBHOOK_SIGNATURE": "v1," + "A" * 10_000},
    ):
        res = Client().post(
            peer_b, data=_push(ids), content_type="text/xml; charset=utf-8", **hostile
        )
        assert res.status_code == 401
    assert not StoredMessage.objects.exists()

    assert peer_post(peer_b, _push(ids)).status_code == 202
    assert StoredMessage.objects.count() == 1


def test_unsigned_pushes_are_taken_while_an_upgrade_allows_them(peer_b, settings):
    settings.HPWSN_FEDERATION_ACCEPT_UNSIGNED = True
    assert peer_post(peer_b, _push(_ids(1)), secret="").status_code == 202
    assert StoredMessage.objects.count() == 1


def test_it_answers_a_fault_to_anything_but_a_notify(peer_b):
    res = peer_post(peer_b, _envelope("<wsnt:Subscribe/>"))
    assert res.status_code == 500
    assert b"is not a wsnt:Notify" in res.content
    res = peer_post(peer_b, b"<not-soap")
    assert res.status_code in (400, 500)
    assert b"Fault" in res.content


def test_a_topic_unknown_here_is_refused_with_the_wsn_fault(peer_b):
    body = _push(["id-9"]).replace(b">ALL1<", b">NOSUCH:TOPIC<")
    res = peer_post(peer_b, body)
    assert res.status_code >= 400
    assert b"TopicNotSupported" in res.content or b"not in the topic tree" in res.content
    assert not StoredMessage.objects.exists()


def _stored() -> list[bytes]:
    return [bytes(r.payload) for r in StoredMessage.objects.order_by("seq")]


def test_a_relayed_notification_keeps_its_origin_and_its_path_with_this_site_appended(peers):
    nid = uuid.uuid4().hex
    relayed = origin_producer(("d", "c", "b"), nid)
    assert peer_post(peers["b"], _push([uuid.uuid4().hex], producers=[relayed])).status_code == 202

    (row,) = _stored()
    assert origin_producer(("d", "c", "b", "a"), nid).encode() in row


def test_the_same_notification_brought_by_two_peers_is_stored_once(peers):
    nid = uuid.uuid4().hex
    # d's notification, relayed to a by b and by c (a ring b-d-c around a): each push names it
    # by the pushing peer's own id, its origin by d's.
    from_b = _push([uuid.uuid4().hex], producers=[origin_producer(("d", "b"), nid)])
    from_c = _push([uuid.uuid4().hex], producers=[origin_producer(("d", "c"), nid)])
    assert peer_post(peers["b"], from_b).status_code == 202
    assert peer_post(peers["c"], from_c).status_code == 202
    # b pushes it again (its answer was lost): still once.
    assert peer_post(peers["b"], from_b).status_code == 202

    (row,) = _stored()
    assert origin_producer(("d", "b", "a"), nid).encode() in row


def test_a_direct_peers_notification_relayed_by_another_peer_is_dropped_and_answered_ok(peers):
    nid = uuid.uuid4().hex
    # c got b's notification from b (b and c are peers) and relays it here before b's own push
    # (a retry, after this site was down) arrives: in the current form and in the form of a
    # site before relaying. Both are answered as stored, so c does not retry them ...
    relayed = _push(
        [uuid.uuid4().hex, uuid.uuid4().hex],
        producers=[origin_producer(("b", "c"), nid), f"urn:hpwsn:federation:b:{nid}"],
        texts=["relayed", "relayed-legacy"],
    )
    assert peer_post(peers["c"], relayed).status_code == 202
    # ... and nothing is stored: b's own link brings it, in b's order.
    assert _stored() == []

    assert peer_post(peers["b"], _push([nid], texts=["direct"])).status_code == 202
    (row,) = _stored()
    assert b"<n>direct</n>" in row
    assert origin_producer(("b", "a"), nid).encode() in row


def test_of_a_relayed_batch_the_copy_of_a_direct_peers_is_dropped_and_a_far_origins_stored(peers):
    # d is no peer of this site: c's copy is the first to come, and is stored.
    far, near = uuid.uuid4().hex, uuid.uuid4().hex
    body = _push(
        [uuid.uuid4().hex, uuid.uuid4().hex],
        producers=[origin_producer(("b", "c"), near), origin_producer(("d", "c"), far)],
        texts=["from-b", "from-d"],
    )
    assert peer_post(peers["c"], body).status_code == 202

    (row,) = _stored()
    assert b"<n>from-d</n>" in row
    assert origin_producer(("d", "c", "a"), far).encode() in row


def test_a_notification_that_has_passed_this_site_is_dropped(peers):
    looped = origin_producer(("a", "c", "b"), uuid.uuid4().hex)
    legacy = f"urn:hpwsn:federation:a:{uuid.uuid4().hex}"  # from a site before relaying
    fresh = uuid.uuid4().hex
    body = _push(
        [uuid.uuid4().hex, uuid.uuid4().hex, fresh],
        producers=[looped, legacy, ""],
        texts=["looped", "legacy", "fresh"],
    )
    assert peer_post(peers["b"], body).status_code == 202

    (row,) = _stored()
    assert b"<n>fresh</n>" in row


def test_fragments_cut_by_one_peer_and_the_whole_message_relayed_by_another_are_stored_once(
    peers,
):
    from hpwsn.fragment import package_xml

    nid = uuid.uuid4().hex
    # b cut its message nid in two (pushed as nid:0 and nid:1, Identification nid) ...
    pieces = []
    for offset, (more, text) in enumerate([(True, "hel"), (False, "lo")]):
        pieces.append(
            f'<wsnt:NotificationMessage><wsnt:Topic Dialect="{ns.DIALECT_COLON}">ALL1'
            f"</wsnt:Topic>{package_xml(nid, f'1-{int(more)}-0-{offset}')}"
            f"<wsnt:Message>{text}</wsnt:Message></wsnt:NotificationMessage>"
        )
    for offset, piece in enumerate(pieces):
        body = _envelope(
            f"<wsnt:Notify>{piece}<hpwsn:MessageIds><hpwsn:Id>{nid}:{offset}</hpwsn:Id>"
            "</hpwsn:MessageIds></wsnt:Notify>"
        )
        assert peer_post(peers["b"], body).status_code == 202
    # ... and c relays the whole message, which it had from b (b is a peer here: dropped).
    whole = _push([uuid.uuid4().hex], producers=[origin_producer(("b", "c"), nid)], texts=["hello"])
    assert peer_post(peers["c"], whole).status_code == 202

    (row,) = _stored()
    assert b"hello" in row
    assert origin_producer(("b", "a"), nid).encode() in row


def test_a_publisher_cannot_pass_its_notify_off_as_forwarded(peers):
    producer = origin_producer(("b",), uuid.uuid4().hex)
    body = (
        _push(["x"], producers=[producer])
        .replace(b"<hpwsn:MessageIds>", b"<!--")
        .replace(b"</hpwsn:MessageIds>", b"-->")
    )
    res = Client().post("/wsn/", data=body, content_type="text/xml; charset=utf-8")
    assert res.status_code in (400, 500)
    assert b"written by the sites of a federation only" in res.content
    assert not StoredMessage.objects.exists()


def test_a_push_that_waits_too_long_for_its_origin_is_answered_503_and_stored_on_retry(
    peers, monkeypatch
):
    from federation import services
    from hpwsn_site import state

    monkeypatch.setattr(services, "_LOCK_WAIT_S", 0.2)
    r = state.get_redis()
    # Another push of d's notifications (d is no peer here: they come relayed, by b or c) is
    # being stored (by another web process).
    r.set(state.federation_lock_key("d"), "another push", px=60_000)
    body = _push([uuid.uuid4().hex], producers=[origin_producer(("d", "b"), uuid.uuid4().hex)])
    try:
        res = peer_post(peers["b"], body)
        assert res.status_code == 503
        assert res.headers["Retry-After"] == "1"
        assert not StoredMessage.objects.exists()
    finally:
        r.delete(state.federation_lock_key("d"))
    assert peer_post(peers["b"], body).status_code == 202
    assert len(_stored()) == 1


def test_a_peers_own_notifications_wait_for_no_other_peers_push(peers, monkeypatch):
    from federation import services
    from hpwsn_site import state

    monkeypatch.setattr(services, "_LOCK_WAIT_S", 0.2)
    r = state.get_redis()
    # b's own notifications have one way in, b's link: they take no origin lock, so a push
    # that holds b's holds them up no more than it would hold a single peer's.
    r.set(state.federation_lock_key("b"), "another push", px=60_000)
    try:
        assert peer_post(peers["b"], _push(_ids(2))).status_code == 202
    finally:
        r.delete(state.federation_lock_key("b"))
    assert len(_stored()) == 2
