"""Writes of the federation: keep this site's links at its peers in step with its interest.

Forwarding itself is WS-Notification: this site subscribes at each peer (a link per topic
subtree its subscribers want) with its inbound address as the consumer; the peer's log, pumps
and retries carry the notifications here, in order per link, at least once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
import uuid
from datetime import UTC, datetime
from xml.sax.saxutils import escape

import httpx
from django.conf import settings
from lxml import etree
from redis.exceptions import RedisError

from dispatch.accept import notifications_accept
from federation import selectors
from federation.models import Link
from federation.peers import LINK_FILTER, Peer, inbound_url, origin_producer
from hpwsn import ns, sqlfilter, wsn
from hpwsn.xmlsafe import parse as xml_parse
from hpwsn_site import state

log = logging.getLogger(__name__)
_TIMEOUT_S = 5.0


class PeerError(Exception):
    """A peer did not do what it was asked (unreachable, or a SOAP fault)."""


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _soap(url: str, body_xml: str, *, to: str | None = None) -> etree._Element:
    """One SOAP 1.1 request; the reply's Body child, or PeerError."""
    header = f"<wsa:MessageID>urn:uuid:{uuid.uuid4()}</wsa:MessageID>"
    if to:
        header += f"<wsa:To>{escape(to)}</wsa:To>"
    envelope = (
        f'<s:Envelope xmlns:s="{ns.SOAP11}" xmlns:wsnt="{ns.WSNT}" xmlns:wsa="{ns.WSA}">'
        f"<s:Header>{header}</s:Header><s:Body>{body_xml}</s:Body></s:Envelope>"
    )
    try:
        resp = httpx.post(
            url,
            content=envelope.encode(),
            headers={"Content-Type": "text/xml; charset=utf-8"},
            timeout=_TIMEOUT_S,
        )
    except httpx.HTTPError as exc:
        raise PeerError(f"{url}: {exc!r}") from exc
    try:
        root = xml_parse(resp.content, max_bytes=1 << 20, max_depth=64)
    except ValueError as exc:
        raise PeerError(f"{url}: HTTP {resp.status_code}, not SOAP") from exc
    body = root.find(f"{{{ns.SOAP11}}}Body")
    child = next((c for c in body if isinstance(c.tag, str)), None) if body is not None else None
    if resp.status_code != 200 or child is None or etree.QName(child).localname == "Fault":
        text = "".join(child.itertext())[:300] if child is not None else ""
        raise PeerError(f"{url}: HTTP {resp.status_code} {text}".strip())
    return child


def _subscribe(peer: Peer, path: str, *, expires_at: float) -> str:
    # The address names the peer: whatever arrives there was forwarded by it.
    consumer = inbound_url(settings.HPWSN_FEDERATION_URL, peer.name, settings.SECRET_KEY)
    body = (
        f"<wsnt:Subscribe><wsnt:ConsumerReference><wsa:Address>{escape(consumer)}</wsa:Address>"
        f"</wsnt:ConsumerReference><wsnt:Filter>"
        f'<wsnt:TopicExpression Dialect="{ns.DIALECT_COLON}">{escape(path)}</wsnt:TopicExpression>'
        f'<wsnt:ProducerProperties Dialect="{sqlfilter.DIALECT}">{escape(LINK_FILTER)}'
        f"</wsnt:ProducerProperties></wsnt:Filter>"
        f"<wsnt:InitialTerminationTime>{_iso(expires_at)}</wsnt:InitialTerminationTime>"
        f"</wsnt:Subscribe>"
    )
    reply = _soap(peer.endpoint, body)
    address = reply.findtext(f"{{{ns.WSNT}}}SubscriptionReference/{{{ns.WSA}}}Address")
    if not address:
        raise PeerError(f"{peer.endpoint}: SubscribeResponse without a SubscriptionReference")
    return address.strip()


def _renew(link: Link, *, expires_at: float) -> None:
    body = (
        f"<wsnt:Renew><wsnt:TerminationTime>{_iso(expires_at)}</wsnt:TerminationTime></wsnt:Renew>"
    )
    _soap(link.reference, body, to=link.reference)


def _unsubscribe(link: Link) -> None:
    _soap(link.reference, "<wsnt:Unsubscribe/>", to=link.reference)


def _heartbeat(peer: Peer) -> None:
    try:
        resp = httpx.get(peer.url + "/healthz", timeout=_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise PeerError(f"{peer.url}/healthz: {exc!r}") from exc
    if resp.status_code >= 500:
        raise PeerError(f"{peer.url}/healthz: HTTP {resp.status_code}")


def federation_peer_sync(*, peer: Peer, interest: list[str], now: float) -> list[str]:
    """Make this site's links at one peer match its interest; returns the linked paths."""
    ttl = settings.HPWSN_FEDERATION_LINK_TTL_S
    links = {link.topic_path: link for link in Link.objects.filter(peer=peer.name)}
    wanted = set(interest)
    # Every round reaches the peer at least once: that is its heartbeat in the site registry.
    _heartbeat(peer)
    for path, gone in links.items():
        if path not in wanted:
            try:
                _unsubscribe(gone)
            except PeerError as exc:  # it expires at the peer on its own
                log.info("federation: unsubscribe at %s failed: %s", peer.name, exc)
            gone.delete()
    for path in sorted(wanted):
        link = links.get(path)
        if link is not None and link.expires_at - now > ttl / 2:
            continue
        if link is not None:
            try:
                _renew(link, expires_at=now + ttl)
                link.expires_at = now + ttl
                link.save(update_fields=["expires_at"])
                continue
            except PeerError as exc:  # the peer lost it (a restart without it): subscribe again
                log.info("federation: renew at %s failed, subscribing again: %s", peer.name, exc)
                link.delete()
        reference = _subscribe(peer, path, expires_at=now + ttl)
        Link.objects.update_or_create(
            peer=peer.name,
            topic_path=path,
            defaults={"reference": reference, "expires_at": now + ttl},
        )
    return sorted(wanted)


def federation_sync(*, now: float | None = None) -> dict[str, str]:
    """One round over every peer (beat, every HPWSN_FEDERATION_SYNC_S); returns errors by peer.

    A round that reached a peer is its heartbeat in the site registry.
    """
    now = time.time() if now is None else now
    interest = selectors.interest_local()
    r = state.get_redis()
    errors: dict[str, str] = {}
    for peer in settings.HPWSN_FEDERATION_PEERS:
        raw = r.hget(state.FEDERATION_PEERS, peer.name)
        rec = json.loads(raw) if raw else {}
        try:
            rec["links"] = federation_peer_sync(peer=peer, interest=interest, now=now)
            rec["last_ok"] = now
            rec["last_error"] = ""
        except PeerError as exc:
            errors[peer.name] = str(exc)
            rec["last_error"] = str(exc)[:500]
            log.warning("federation: peer %s: %s", peer.name, exc)
        r.hset(state.FEDERATION_PEERS, peer.name, json.dumps(rec))
    return errors


def _producer_xml(address: str) -> bytes:
    return (
        f'<wsnt:ProducerReference xmlns:wsnt="{ns.WSNT}" xmlns:wsa="{ns.WSA}">'
        f"<wsa:Address>{escape(address)}</wsa:Address></wsnt:ProducerReference>"
    ).encode()


async def federation_accept(
    *, peer: str, notifications: list[wsn.NotificationIn], ids: list[str], message_id: str | None
) -> int:
    """Store what a peer forwarded, each message once however often it arrives; returns how
    many were new. Each is marked with its origin (peers.origin_producer), which keeps it from
    being forwarded again."""
    if len(ids) != len(notifications):  # not an HPwsn peer: the push's own id, per message
        ids = [f"{message_id}#{index}" for index in range(len(notifications))]
    # Messages already stored from an earlier push (the sender's answer was lost, and its retry
    # cut the batch differently) are dropped by their origin id.
    r = state.get_async_redis()
    keys = [state.federation_seen_key(peer, i) for i in ids]
    try:
        seen = await r.mget(keys)
    except RedisError:  # the log's idempotency key below still catches an identical batch
        seen = [None] * len(keys)
    fresh = [(i, n) for i, n, s in zip(ids, notifications, seen, strict=True) if s is None]
    if not fresh:
        return 0
    for origin_id, n in fresh:
        n.producer_xml = _producer_xml(origin_producer(peer, origin_id))
    # One accept for the whole batch (one transaction, one Redis script): its key is made of the
    # origin ids, so the same batch pushed again is stored once.
    await notifications_accept(
        notifications=[n for _i, n in fresh],
        idempotency_key=f"federation|{peer}|"
        + hashlib.sha256(",".join(i for i, _n in fresh).encode()).hexdigest(),
    )
    with contextlib.suppress(RedisError):
        pipe = r.pipeline(transaction=False)
        for origin_id, _n in fresh:
            pipe.set(
                state.federation_seen_key(peer, origin_id), 1, ex=settings.HPWSN_DEDUP_WINDOW_S
            )
        await pipe.execute()
    return len(fresh)
