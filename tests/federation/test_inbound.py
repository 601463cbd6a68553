"""The inbound edge: what a peer pushes is stored once, marked with its path; the rest refused."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from django.test import Client

from dispatch.models import StoredMessage
from dispatch.push import signature_headers
from federation import services
from federation.models import Link
from federation.peers import (
    inbound_token,
    link_signing_secret,
    origin_producer,
    peers_parse,
)
from hpwsn import ns
from hpwsn_site import state
from tests.federation.helpers import peer_post
from tests.support import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def peers(settings):  # type: ignore[no-untyped-def]
    """This site is a; b and c are its peers, where it holds a link for ALL1 each: their inbound
    paths. Each peer's inbound allowance starts full."""
    from topics.services import topics_load_demo

    topics_load_demo()
    settings.HPWSN_SITE_NAME = "a"
    settings.HPWSN_FEDERATION_PEERS = peers_parse(
        "b=http://127.0.0.1:9,c=http://127.0.0.1:9", own="a"
    )
    for peer in "bc":
        _link(peer, "ALL1")
    r = state.get_redis()
    r.delete(*(state.federation_rate_key(p) for p in "bc"))
    services._links_read.clear()  # what an earlier test linked, as this process last read it
    yield {p: f"/federation/in/{p}/{inbound_token(settings.SECRET_KEY, p)}/" for p in "bc"}
    r.delete(*(state.federation_rate_key(p) for p in "bc"))


def _link(peer: str, topic: str) -> None:
    """A link this site holds at `peer` for `topic` (as a sync round records it)."""
    Link.objects.create(
        peer=peer,
        topic_path=topic,
        reference=f"http://127.0.0.1:9/wsn/subscriptions/{uuid.uuid4().hex}",
        expires_at=time.time() + 300,
        interest_path=["a"],
        signed=True,
    )


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


def _push(  # type: ignore[no-untyped-def]
    ids: list[str],
    *,
    producers: list[str] | None = None,
    texts: list[str] | None = None,
    topics: list[str] | None = None,
):
    """A peer's Notify: messages with these push ids (their text the id unless given), each
    with a ProducerReference when given, on ALL1 unless `topics` says otherwise."""
    producers = producers or [""] * len(ids)
    texts = texts or ids
    topics = topics or ["ALL1"] * len(ids)
    messages = "".join(
        f'<wsnt:NotificationMessage><wsnt:Topic Dialect="{ns.DIALECT_COLON}">{topic}</wsnt:Topic>'
        f"{_producer(p) if p else ''}<wsnt:Message><n>{t}</n></wsnt:Message>"
        "</wsnt:NotificationMessage>"
        for t, p, topic in zip(texts, producers, topics, strict=True)
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


def test_hpwsn_ids_inside_a_payload_are_not_taken_for_the_pushs_ids(peer_b):
    # Every hpwsn:Id of the body was read: a publisher's payload holding some made the list too
    # long, and the push's ids were made from its wsa:MessageID, the same for another push
    # under that id, which was then dropped as already stored.
    ids = _ids(2)
    planted = "<hpwsn:Id>planted-1</hpwsn:Id><hpwsn:Id>planted-2</hpwsn:Id>"
    first = _push(ids[:1], texts=[f"</n>{planted}<n>"])
    assert peer_post(peer_b, first).status_code == 202
    assert peer_post(peer_b, _push(ids[1:], texts=[f"</n>{planted}<n>"])).status_code == 202

    rows = [bytes(r.payload) for r in StoredMessage.objects.order_by("seq")]
    assert len(rows) == 2
    assert origin_producer(("b", "a"), ids[0]).encode() in rows[0]
    assert origin_producer(("b", "a"), ids[1]).encode() in rows[1]


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
    _link("b", "NOSUCH")  # asked for at b: this site's tree decides
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


# ----------------------------------------------------------------------------- a hostile peer


def test_a_push_on_a_topic_not_asked_of_that_peer_is_refused_whole_and_nothing_stored(peers):
    """This site holds links at b for ALL1 and ALL:ALARM: b may push those subtrees, nothing else
    (not ALL2, which c was asked for, nor ALL, the parent of what b was asked for)."""
    _link("b", "ALL:ALARM")
    _link("c", "ALL2")
    for topics in (["ALL2"], ["ALL"], ["ALL1", "ALL2"]):
        res = peer_post(peers["b"], _push(_ids(len(topics)), topics=topics))
        assert res.status_code == 500, topics  # a SOAP 1.1 fault: the peer's pump retries
        assert b"NotAuthorized" in res.content
        assert f"<hpwsn:Topic {_HPWSN_X}>{topics[-1]}</hpwsn:Topic>".encode() in res.content
        assert b"a holds no link at b for it (its links there: ALL1, ALL:ALARM)" in res.content
    assert _stored() == []

    # What was asked for, its subtrees included, is stored.
    ids = _ids(2)
    res = peer_post(peers["b"], _push(ids, topics=["ALL1", "ALL:ALARM:ALARM1:ALARM11"]))
    assert res.status_code == 202
    assert peer_post(peers["c"], _push(_ids(1), topics=["ALL2"])).status_code == 202
    assert len(_stored()) == 3


_HPWSN_X = f'xmlns:hpwsn="{ns.HPWSN}"'


def test_pushes_past_a_peers_inbound_rate_are_answered_503_and_stored_when_retried(peers, settings):
    settings.HPWSN_FEDERATION_INBOUND_RATE = "20/second"
    settings.HPWSN_FEDERATION_INBOUND_BURST = 10
    first, later = _ids(10), _ids(5)
    assert peer_post(peers["b"], _push(first)).status_code == 202  # the burst

    res = peer_post(peers["b"], _push(later))
    assert res.status_code == 503
    assert res.headers["Retry-After"] == "1"
    assert b"HPWSN_FEDERATION_INBOUND_RATE" in res.content
    assert len(_stored()) == 10
    # Another peer's allowance is its own.
    assert peer_post(peers["c"], _push(_ids(3))).status_code == 202

    # The peer's pump retries the refused push (its Retry-After, 503 being transient): once the
    # allowance has grown back it is stored, and nothing is lost nor stored twice.
    assert wait_until(lambda: peer_post(peers["b"], _push(later)).status_code == 202, timeout=5)
    stored = _stored()
    assert len(stored) == 18
    for nid in first + later:
        assert sum(origin_producer(("b", "a"), nid).encode() in row for row in stored) == 1


def test_the_peers_pump_retries_a_push_refused_for_its_rate_and_delivers_it(
    peers, settings, live_server
):
    """What the peer's pump does with the answer (dispatch.push.post, dispatch.deliver): a
    transient failure, retried after the Retry-After, and then delivered."""
    from dispatch.deliver import retry_delay
    from federation.peers import link_signing_secret

    settings.HPWSN_FEDERATION_INBOUND_RATE = "5/second"
    settings.HPWSN_FEDERATION_INBOUND_BURST = 5
    url = live_server.url + peers["b"]
    secret = link_signing_secret(settings.SECRET_KEY, "b")

    def send(ids: list[str]):  # type: ignore[no-untyped-def]
        from dispatch.push import post

        body = _push(ids)
        return post(url, body, soap_version="1.1", message_id=f"msg_{ids[0]}", secret=secret)

    assert send(_ids(5)).ok
    held = _ids(4)
    refused = send(held)
    assert (refused.ok, refused.permanent, refused.status) == (False, False, 503)
    assert refused.retry_after == 1.0
    delay = retry_delay(attempt=1, schedule=[0.0, 1.0], jitter=0.0, retry_after=refused.retry_after)
    assert delay == 1.0
    assert len(_stored()) == 5

    assert wait_until(lambda: send(held).ok, timeout=5)
    assert len(_stored()) == 9


def test_a_peer_flooding_a_far_origins_pushes_does_not_starve_another_peer_of_it(
    peers, settings, monkeypatch
):
    """b pushes notifications relayed from d (no peer of this site) back to back, many at once,
    each holding d's lock while it is stored; c relays d's genuine notifications meanwhile. Each
    of c's pushes waits its turn, and is stored."""
    import threading

    from django.db import connection

    from federation import services

    monkeypatch.setattr(services, "_LOCK_WAIT_S", 1.0)
    # Unlimited: the lock itself is to be fair, whatever rate a peer is allowed.
    settings.HPWSN_FEDERATION_INBOUND_RATE = "0/second"
    real_accept = services.notifications_accept

    async def large(**kwargs):  # type: ignore[no-untyped-def]
        # b's pushes are large (hundreds of notifications): each takes a while to store.
        if kwargs["principal"].name == "site:b":
            await asyncio.sleep(0.2)
        return await real_accept(**kwargs)

    monkeypatch.setattr(services, "notifications_accept", large)
    stop = threading.Event()

    def flood() -> None:
        try:
            while not stop.is_set():
                nid = uuid.uuid4().hex
                body = _push([nid], producers=[origin_producer(("d", "b"), uuid.uuid4().hex)])
                peer_post(peers["b"], body)
        finally:
            connection.close()

    flooders = [threading.Thread(target=flood, daemon=True) for _ in range(8)]
    for t in flooders:
        t.start()
    try:
        assert wait_until(lambda: len(_stored()) >= 8, timeout=30)  # the flood is on
        genuine = [uuid.uuid4().hex for _ in range(5)]
        answers = [
            peer_post(
                peers["c"],
                _push([uuid.uuid4().hex], producers=[origin_producer(("d", "c"), nid)]),
            ).status_code
            for nid in genuine
        ]
    finally:
        stop.set()
        for t in flooders:
            t.join(timeout=30)
    assert answers == [202] * 5
    stored = _stored()
    for nid in genuine:
        assert sum(origin_producer(("d", "c", "a"), nid).encode() in row for row in stored) == 1
