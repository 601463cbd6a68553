"""Writes of the federation: keep this site's links at its peers in step with its interest.

Forwarding itself is WS-Notification: this site subscribes at each peer (a link per topic
subtree wanted here, by its own subscribers or through its other peers) with its inbound address
as the consumer, as its account there if it has one (HPWSN_FEDERATION_CREDENTIALS); the peer's
log, pumps and retries carry the notifications here, in order per link, at least once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit
from xml.sax.saxutils import escape

import httpx
from django.conf import settings
from lxml import etree
from redis.exceptions import RedisError

from dispatch.accept import notifications_accept
from dispatch.push import check_target, tls_context
from federation import selectors
from federation.models import Link
from federation.peers import (
    SIGNATURE_TOLERANCE_S,
    Interest,
    Peer,
    inbound_url,
    interest_for_peer,
    link_filter,
    link_signing_secret,
    origin_id_clean,
    origin_of,
    origin_producer,
    relay_path,
    relayed_copy_of_peer,
)
from hpwsn import errors, ns, sqlfilter, wsn
from hpwsn.targets import TargetRefused
from hpwsn.xmlsafe import parse as xml_parse
from hpwsn_site import state
from hpwsn_site.env import parse_rate
from hpwsn_site.soapcall import db
from topics import acl

log = logging.getLogger(__name__)
# A call to a peer is whole within this, however the peer paces its bytes: one peer that answers
# a byte at a time must not hold the round, and with it the links at every other peer.
_TIMEOUT_S = 5.0
# What is read of a peer's answer: a SubscribeResponse is a few hundred bytes.
_MAX_ANSWER_BYTES = 1 << 20


# The sync round's lease: longer than one call to a peer can take (_TIMEOUT_S), renewed before
# every call, so a round whose worker died frees the next one soon.
_LEASE_MS = 15_000
# Release or extend a lock only if it is still the caller's (it may have expired and been taken).
_UNLOCK = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end"
_EXTEND = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then "
    "return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"
)


class PeerError(Exception):
    """A peer did not do what it was asked (unreachable, or a SOAP fault)."""


class PeerRefused(PeerError):
    """The peer answered with a SOAP fault: it is up, and refuses this request."""


class ReferenceRefused(PeerRefused):
    """The peer answered a SubscriptionReference outside the push allow-list: it is not called."""


@dataclass(frozen=True)
class PeerSync:
    """What a sync round made of this site's links at one peer."""

    linked: list[str]  # the topic paths linked there
    # topic path -> the peer's fault, for those it would not link; or why the reference it
    # answered was not called (the link is made again)
    refused: dict[str, str]


class _LeaseLost(Exception):
    """The sync round outlived its lease and another round may be running: it stops."""


class _Lease:
    """One sync round at a time per site: two rounds that saw different interest would each make
    a link for the same topic with another path, and the one not recorded would push everything
    twice until it expires."""

    def __init__(self, r: Any) -> None:
        self.r = r
        self.token = uuid.uuid4().hex

    def take(self) -> bool:
        return bool(self.r.set(state.FEDERATION_SYNC_LOCK, self.token, nx=True, px=_LEASE_MS))

    def keep(self) -> None:
        if not self.r.eval(_EXTEND, 1, state.FEDERATION_SYNC_LOCK, self.token, _LEASE_MS):
            raise _LeaseLost

    def release(self) -> None:
        with contextlib.suppress(RedisError):
            self.r.eval(_UNLOCK, 1, state.FEDERATION_SYNC_LOCK, self.token)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _auth(peer: str) -> httpx.BasicAuth | None:
    """HTTP Basic with this site's account at the peer, if it has one (else anonymous)."""
    account = settings.HPWSN_FEDERATION_CREDENTIALS.get(peer)
    return None if account is None else httpx.BasicAuth(account.user, account.password)


def _user(peer: str) -> str:
    account = settings.HPWSN_FEDERATION_CREDENTIALS.get(peer)
    return "" if account is None else str(account.user)


def _call(
    method: str,
    url: str,
    *,
    content: bytes | None = None,
    headers: dict[str, str] | None = None,
    auth: httpx.BasicAuth | None = None,
) -> tuple[int, bytes]:
    """One HTTP exchange with a peer: its status and body, or PeerError. Redirects are not
    followed (they could lead anywhere), a compressed or longer answer than _MAX_ANSWER_BYTES is
    not read, and the whole exchange ends within _TIMEOUT_S (httpx's timeouts are per read, so a
    peer sending a byte now and then would hold the call for as long as it likes)."""
    try:
        return asyncio.run(_call_within(method, url, content=content, headers=headers, auth=auth))
    except TimeoutError as exc:
        raise PeerError(f"{url}: no whole answer within {_TIMEOUT_S:g} s") from exc
    except httpx.HTTPError as exc:
        raise PeerError(f"{url}: {exc!r}") from exc


async def _call_within(
    method: str,
    url: str,
    *,
    content: bytes | None,
    headers: dict[str, str] | None,
    auth: httpx.BasicAuth | None,
) -> tuple[int, bytes]:
    async with (
        asyncio.timeout(_TIMEOUT_S),
        httpx.AsyncClient(timeout=_TIMEOUT_S, verify=tls_context()) as client,
        client.stream(
            method,
            url,
            content=content,
            headers={**(headers or {}), "Accept-Encoding": "identity"},
            auth=auth,
        ) as resp,
    ):
        encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding != "identity":
            raise PeerError(f"{url}: HTTP {resp.status_code}, a {encoding!r} answer not asked for")
        body = bytearray()
        async for chunk in resp.aiter_raw():
            body += chunk
            if len(body) > _MAX_ANSWER_BYTES:
                raise PeerError(
                    f"{url}: HTTP {resp.status_code}, an answer of more than "
                    f"{_MAX_ANSWER_BYTES} bytes"
                )
        return resp.status_code, bytes(body)


def _soap(
    url: str, body_xml: str, *, to: str | None = None, auth: httpx.BasicAuth | None = None
) -> etree._Element:
    """One SOAP 1.1 request; the reply's Body child, or PeerError."""
    header = f"<wsa:MessageID>urn:uuid:{uuid.uuid4()}</wsa:MessageID>"
    if to:
        header += f"<wsa:To>{escape(to)}</wsa:To>"
    envelope = (
        f'<s:Envelope xmlns:s="{ns.SOAP11}" xmlns:wsnt="{ns.WSNT}" xmlns:wsa="{ns.WSA}">'
        f"<s:Header>{header}</s:Header><s:Body>{body_xml}</s:Body></s:Envelope>"
    )
    status, content = _call(
        "POST",
        url,
        content=envelope.encode(),
        headers={"Content-Type": "text/xml; charset=utf-8"},
        auth=auth,
    )
    try:
        root = xml_parse(content, max_bytes=_MAX_ANSWER_BYTES, max_depth=64)
    except ValueError as exc:
        raise PeerError(f"{url}: HTTP {status}, not SOAP") from exc
    body = root.find(f"{{{ns.SOAP11}}}Body")
    child = next((c for c in body if isinstance(c.tag, str)), None) if body is not None else None
    if child is not None and etree.QName(child).localname == "Fault":
        text = " ".join(" ".join(child.itertext()).split())[:300]
        raise PeerRefused(f"{url}: HTTP {status} {text}".strip())
    if status != 200 or child is None:
        raise PeerError(f"{url}: HTTP {status}")
    return child


def _link_filter(peer: Peer) -> str:
    """The ProducerProperties filter of this site's links at `peer` (peers.link_filter)."""
    others = (p.name for p in settings.HPWSN_FEDERATION_PEERS if p.name != peer.name)
    return link_filter(settings.HPWSN_SITE_NAME, others=others)


def _subscribe(
    peer: Peer,
    path: str,
    *,
    interest_path: tuple[str, ...],
    producer_filter: str,
    expires_at: float,
) -> str:
    # The address names the peer: whatever arrives there was forwarded by it.
    consumer = inbound_url(settings.HPWSN_FEDERATION_URL, peer.name, settings.SECRET_KEY)
    sites = "".join(f"<hpwsn:Site>{escape(site)}</hpwsn:Site>" for site in interest_path)
    others = "".join(
        f"<hpwsn:Site>{escape(p.name)}</hpwsn:Site>"
        for p in settings.HPWSN_FEDERATION_PEERS
        if p.name != peer.name
    )
    secret = link_signing_secret(settings.SECRET_KEY, peer.name)  # base64: nothing to escape
    body = (
        f"<wsnt:Subscribe><wsnt:ConsumerReference><wsa:Address>{escape(consumer)}</wsa:Address>"
        f"</wsnt:ConsumerReference><wsnt:Filter>"
        f'<wsnt:TopicExpression Dialect="{ns.DIALECT_COLON}">{escape(path)}</wsnt:TopicExpression>'
        f'<wsnt:ProducerProperties Dialect="{sqlfilter.DIALECT}">'
        f"{escape(producer_filter)}</wsnt:ProducerProperties></wsnt:Filter>"
        f"<wsnt:InitialTerminationTime>{_iso(expires_at)}</wsnt:InitialTerminationTime>"
        f'<wsnt:SubscriptionPolicy><hpwsn:InterestPath xmlns:hpwsn="{ns.HPWSN}">{sites}'
        f'</hpwsn:InterestPath><hpwsn:Peers xmlns:hpwsn="{ns.HPWSN}">{others}</hpwsn:Peers>'
        f'<hpwsn:SigningSecret xmlns:hpwsn="{ns.HPWSN}">{secret}'
        f"</hpwsn:SigningSecret></wsnt:SubscriptionPolicy></wsnt:Subscribe>"
    )
    reply = _soap(peer.endpoint, body, auth=_auth(peer.name))
    address = reply.findtext(f"{{{ns.WSNT}}}SubscriptionReference/{{{ns.WSA}}}Address")
    if not address:
        raise PeerError(f"{peer.endpoint}: SubscribeResponse without a SubscriptionReference")
    return _reference_check(peer.name, address.strip())


def _reference_check(peer: str, reference: str) -> str:
    """The reference a peer answered, if this site may call it: the allow-list of pushes, as for
    a consumer's address. The peer may answer any address it likes (the cloud's metadata service,
    an internal one) and this site would renew and end the link there; it is checked when the
    link is made and again before every call (its name may resolve elsewhere since). Its origin
    need not be the peer's configured URL: a peer behind a proxy may answer its public one."""
    try:
        check_target(reference)
    except TargetRefused as exc:
        raise ReferenceRefused(
            f"{peer} answered the SubscriptionReference {reference[:200]!r}, not called: {exc}"
        ) from None
    return reference


_PORTS = {"http": 80, "https": 443}


def _reference_auth(peer: Peer, reference: str) -> httpx.BasicAuth | None:
    """The site's account at the peer, for a reference at the peer's own origin (scheme, host and
    port of its configured URL) only: a reference elsewhere is called without it, so the peer
    cannot hand this site's password to another host. Such a call is refused where the account
    was needed, and the link is then made again."""
    ref, own = urlsplit(reference), urlsplit(peer.url)
    same = (ref.scheme, ref.hostname, ref.port or _PORTS.get(ref.scheme)) == (
        own.scheme,
        own.hostname,
        own.port or _PORTS.get(own.scheme),
    )
    return _auth(peer.name) if same else None


def _renew(peer: Peer, link: Link, *, expires_at: float) -> None:
    body = (
        f"<wsnt:Renew><wsnt:TerminationTime>{_iso(expires_at)}</wsnt:TerminationTime></wsnt:Renew>"
    )
    reference = _reference_check(link.peer, link.reference)
    _soap(reference, body, to=reference, auth=_reference_auth(peer, reference))


def _unsubscribe(peer: Peer, link: Link) -> None:
    reference = _reference_check(link.peer, link.reference)
    _soap(reference, "<wsnt:Unsubscribe/>", to=reference, auth=_reference_auth(peer, reference))


def _heartbeat(peer: Peer) -> None:
    status, _body = _call("GET", peer.url + "/healthz")
    if status >= 500:
        raise PeerError(f"{peer.url}/healthz: HTTP {status}")


def federation_peer_sync(
    *,
    peer: Peer,
    interest: dict[str, tuple[str, ...]],
    now: float,
    keep: Callable[[], None] = lambda: None,
) -> PeerSync:
    """Make this site's links at one peer match what it asks there (topic path -> interest
    path, federation.peers.interest_for_peer). `keep` is called before each call to the peer
    (the round's lease).

    A topic the peer refuses (not in its tree, not open to this site) is left out and reported;
    the others are linked all the same: one subscriber's wildcard that reaches such a root must
    not cut the site off from the rest of what the peer publishes.
    """
    ttl = settings.HPWSN_FEDERATION_LINK_TTL_S
    producer_filter = _link_filter(peer)
    user = _user(peer.name)
    links = {link.topic_path: link for link in Link.objects.filter(peer=peer.name)}
    refused: dict[str, str] = {}
    # Every round reaches the peer at least once: that is its heartbeat in the site registry.
    keep()
    _heartbeat(peer)
    for path, gone in links.items():
        if path not in interest:
            keep()
            _unsubscribe_quietly(peer, gone)
            gone.delete()
    for path, interest_path in sorted(interest.items()):
        link = links.get(path)
        if (
            link is not None
            and tuple(link.interest_path) == interest_path
            and link.producer_filter == producer_filter
            and link.user == user
            and link.signed
        ):
            if link.expires_at - now > ttl / 2:
                continue
            keep()
            try:
                _renew(peer, link, expires_at=now + ttl)
                link.expires_at = now + ttl
                link.save(update_fields=["expires_at"])
                continue
            except ReferenceRefused as exc:  # not called: made again, and the reason shown
                log.warning("federation: %s", exc)
                refused[path] = str(exc)
                link.delete()
                link = None
            except PeerError as exc:  # the peer lost it (a restart without it): subscribe again
                log.info("federation: renew at %s failed, subscribing again: %s", peer.name, exc)
                link.delete()
                link = None
        keep()
        try:
            reference = _subscribe(
                peer,
                path,
                interest_path=interest_path,
                producer_filter=producer_filter,
                expires_at=now + ttl,
            )
        except PeerRefused as exc:  # a link made before, if any, stands until it expires
            refused[path] = str(exc)
            continue
        Link.objects.update_or_create(
            peer=peer.name,
            topic_path=path,
            defaults={
                "reference": reference,
                "expires_at": now + ttl,
                "interest_path": list(interest_path),
                "producer_filter": producer_filter,
                "user": user,
                "signed": True,
            },
        )
        if link is not None and link.reference != reference:
            # Its interest now comes by another path (or it predates paths), or this site's peers
            # changed and with them its filter, or its account at the peer, or it predates signed
            # pushes: the new link is in place before the old one ends, so nothing published
            # meanwhile is missed (what both carry is stored here once). One made with another
            # account may refuse to be ended by this one: it expires at the peer.
            keep()
            _unsubscribe_quietly(peer, link)
    linked = Link.objects.filter(peer=peer.name).values_list("topic_path", flat=True)
    return PeerSync(linked=sorted(linked), refused=refused)


def _unsubscribe_quietly(peer: Peer, link: Link) -> None:
    try:
        _unsubscribe(peer, link)
    except ReferenceRefused as exc:  # not called: it expires at the peer on its own
        log.warning("federation: %s", exc)
    except PeerError as exc:  # it expires at the peer on its own
        log.info("federation: unsubscribe at %s failed: %s", peer.name, exc)


def federation_sync(*, now: float | None = None) -> dict[str, str]:
    """One round over every peer (beat, every HPWSN_FEDERATION_SYNC_S); returns errors by peer.

    A round that reached a peer is its heartbeat in the site registry. While another round runs
    this one does nothing.
    """
    now = time.time() if now is None else now
    r = state.get_redis()
    lease = _Lease(r)
    if not lease.take():  # another round is running: it does the work
        return {}
    try:
        return _sync_round(r, lease, now=now)
    except _LeaseLost:
        log.warning("federation: a sync round outlived its lease and stopped")
        return {}
    finally:
        lease.release()


def _sync_round(r: Any, lease: _Lease, *, now: float) -> dict[str, str]:
    held: list[Interest] = selectors.interest_held()
    own = settings.HPWSN_SITE_NAME
    errors: dict[str, str] = {}
    for peer in settings.HPWSN_FEDERATION_PEERS:
        raw = r.hget(state.FEDERATION_PEERS, peer.name)
        rec = json.loads(raw) if raw else {}
        wanted = interest_for_peer(held, own=own, peer=peer.name)
        try:
            done = federation_peer_sync(peer=peer, interest=wanted, now=now, keep=lease.keep)
            rec["links"] = done.linked
            # The interest path each link states (the site registry shows what it relays).
            rec["paths"] = {
                topic: "/".join(path) for topic, path in wanted.items() if topic in done.linked
            }
            rec["last_ok"] = now
            rec["last_error"] = "; ".join(
                f"{topic} refused: {why}" for topic, why in sorted(done.refused.items())
            )[:500]
            if done.refused:
                errors[peer.name] = rec["last_error"]
                log.warning("federation: peer %s: %s", peer.name, rec["last_error"])
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


def peer_principal(peer: str) -> acl.Principal:
    """Who a peer's forwarded notifications are published as here: `site:<peer>`, in
    HPWSN_FEDERATION_GROUP. Its inbound address (an HMAC of this site's secret) authenticates it,
    so a topic's publish_groups can admit federated traffic and still refuse anonymous callers."""
    return acl.Principal(
        name=f"site:{peer}",
        groups=frozenset({settings.HPWSN_FEDERATION_GROUP}),
        method="federation",
    )


class InboundBusy(Exception):
    """Another push of the same origin's notifications is being stored for too long: the peer
    is to try again (503)."""


class InboundLimited(Exception):
    """The peer pushed more than HPWSN_FEDERATION_INBOUND_RATE lets it: nothing of the push is
    stored, and the peer is to try again in `retry_after` seconds (503)."""

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


# A token bucket per peer, in notifications: KEYS[1] its hash (tokens, at). ARGV[1] now (epoch
# seconds), ARGV[2] the rate (per second), ARGV[3] the burst, ARGV[4] what the push costs. 0: taken;
# else the milliseconds until the bucket holds that much. A refused push takes nothing, so it is
# taken when the peer pushes it again once the bucket has grown back; a bucket left alone for as
# long as it takes to fill expires, and is full when it is made again.
_RATE_TAKE = """
local now, rate = tonumber(ARGV[1]), tonumber(ARGV[2])
local burst, cost = tonumber(ARGV[3]), tonumber(ARGV[4])
local held = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens, at = tonumber(held[1]), tonumber(held[2])
if not tokens or not at then
  tokens, at = burst, now
end
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
if tokens < cost then
  return math.max(1, math.ceil((cost - tokens) / rate * 1000))
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens - cost), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return 0
"""


async def _rate_take(r: Any, peer: str, count: int) -> None:
    """Take `count` notifications from the peer's allowance (HPWSN_FEDERATION_INBOUND_RATE), or
    InboundLimited. A push larger than the burst costs the burst: it passes when the bucket is
    full, never waits for a bucket that cannot hold it."""
    limit, period = parse_rate(settings.HPWSN_FEDERATION_INBOUND_RATE)
    burst = max(int(settings.HPWSN_FEDERATION_INBOUND_BURST), 1)
    if limit <= 0 or count <= 0:
        return
    rate = limit / period
    try:
        wait_ms = int(
            await r.eval(
                _RATE_TAKE,
                1,
                state.federation_rate_key(peer),
                repr(time.time()),
                repr(rate),
                burst,
                min(count, burst),
            )
        )
    except RedisError:  # the accept needs Redis too, and says so
        return
    if wait_ms:
        retry_after = max(1, math.ceil(wait_ms / 1000))
        raise InboundLimited(
            f"{peer} pushed {count} notifications, past HPWSN_FEDERATION_INBOUND_RATE "
            f"({settings.HPWSN_FEDERATION_INBOUND_RATE}, a burst of {burst}) at "
            f"{settings.HPWSN_SITE_NAME}: nothing of it was stored, push it again in "
            f"{retry_after} s",
            retry_after=retry_after,
        )


# The topic paths of this site's links per peer, read at most this often by a process: a push
# on a topic not among them is checked against the database before it is refused (the link may
# have been made since), and one the site unlinked since is taken for at most this long.
_LINKS_MAX_AGE_S = 1.0
_links_read: dict[str, tuple[float, list[str]]] = {}


async def _links_at(peer: str, *, fresh: bool) -> list[str]:
    held = _links_read.get(peer)
    if not fresh and held is not None and time.monotonic() - held[0] < _LINKS_MAX_AGE_S:
        return held[1]
    topics = await db(selectors.link_topics, peer=peer)
    _links_read[peer] = (time.monotonic(), topics)
    return topics


def _pushed_path(n: wsn.NotificationIn) -> str:
    """The topic path a pushed notification names (the faults a publisher's Notify gets)."""
    if n.topic is None:
        raise errors.TopicNotSupported("a notification must name its wsnt:Topic")
    expr = errors.topic_expression_parse(n.topic.text, n.topic.dialect, n.topic.nsmap)
    if not expr.is_concrete:
        raise errors.InvalidTopicExpression(
            f"the topic of a notification must be concrete, not '{n.topic.text}'"
        )
    return ":".join(expr.concrete()[1])


def _linked(path: str, links: list[str]) -> bool:
    return any(path == topic or path.startswith(topic + ":") for topic in links)


async def _topics_check(peer: str, notifications: list[wsn.NotificationIn]) -> None:
    """Every notification of the push lies in a subtree this site holds a link for at `peer`
    (federation_peer_sync), else NotAuthorized for the whole push: a peer pushes what this site
    asked it for, and nothing else (a link's pushes carry its subtree only, so a mixed push is no
    link's). The fault is SOAP 1.1's 500, which the peer's pump retries: a push that came before
    this site recorded a link just made is taken on a retry."""
    paths = [_pushed_path(n) for n in notifications]
    links = await _links_at(peer, fresh=False)
    if all(_linked(path, links) for path in paths):
        return
    links = await _links_at(peer, fresh=True)
    for path in paths:
        if not _linked(path, links):
            own = settings.HPWSN_SITE_NAME
            raise errors.NotAuthorized(
                f"{peer} pushed a notification on topic '{path}', and {own} holds no link at "
                f"{peer} for it (its links there: {', '.join(links) or 'none'}): a peer pushes "
                f"only the topics this site subscribed to there; nothing of the push was stored",
                detail_xml=errors.not_authorized_xml(peer_principal(peer).name, "publish", path),
            )


# Each message of a push, unless it was stored already: KEYS[i] its per-peer seen key, KEYS[n+i]
# the key of its origin. ARGV[1] the peer, ARGV[2] the dedup window in seconds. Per message: 0 to
# drop it (seen, or its origin brought by another peer), 1 its origin already claimed by this
# peer (a fragment of the same message, a retry), 2 claimed now.
_CLAIM = """
local n = #KEYS / 2
local out = {}
for i = 1, n do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    out[i] = 0
  else
    local held = redis.call('GET', KEYS[n + i])
    if not held then
      redis.call('SET', KEYS[n + i], ARGV[1], 'EX', ARGV[2])
      out[i] = 2
    elseif held == ARGV[1] then
      out[i] = 1
    else
      out[i] = 0
    end
  end
end
return out
"""
_LOCK_TTL_MS = 30_000
_LOCK_WAIT_S = 10.0
# Take an origin's lock in turns between peers. KEYS[1] the lock, KEYS[2] its turn; ARGV[1] this
# push's token, "<peer>|<random>", ARGV[2] the peer, ARGV[3] the lock's and ARGV[4] the turn's
# time to live (ms). 1: taken. A push that finds the lock held by another peer's push claims the
# next turn for its peer (and keeps it while it waits); a free lock goes to the peer whose turn
# it is, else to the first to ask. So a peer whose pushes follow each other without a gap cannot
# keep it from another peer: they take it in turns, and a waiting push's wait is bounded by the
# pushes of the peers before it, one each. A turn whose push stopped waiting lapses.
_LOCK_TAKE = """
local holder = redis.call('GET', KEYS[1])
local turn = redis.call('GET', KEYS[2])
if not holder and (not turn or turn == ARGV[2]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
  if turn then
    redis.call('DEL', KEYS[2])
  end
  return 1
end
local ours = holder and string.sub(holder, 1, #ARGV[2] + 1) == ARGV[2] .. '|'
if turn == ARGV[2] or (not turn and not ours) then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[4])
end
return 0
"""
_TURN_TTL_MS = 250


@dataclass(slots=True)
class _Inbound:
    push_id: str  # its id in the push (hpwsn:Id): the peer's own id of what it stored
    notification: wsn.NotificationIn
    path: tuple[str, ...]  # the sites it has passed, origin first, this site last
    origin_id: str


def _own_id(push_id: str, n: wsn.NotificationIn) -> str:
    """The origin id of a message the peer did not get from elsewhere: its id there.

    A message the peer cut into fragments is pushed as `<id>:<n>` with the Identification `<id>`:
    every fragment names the whole message, which other peers may relay whole or cut otherwise.
    """
    package = n.package
    if package is not None and package.fragmented:
        ident = package.identification
        if push_id.startswith(ident + ":") and push_id[len(ident) + 1 :].isdigit():
            return origin_id_clean(ident)
    return origin_id_clean(push_id)


@contextlib.asynccontextmanager
async def _origins_locked(r: Any, origins: Iterable[str], *, peer: str) -> AsyncIterator[None]:
    """Hold the inbound lock of these origins (in name order: two pushes never wait on each
    other crosswise), taken in turns between the peers that push them (_LOCK_TAKE)."""
    token = f"{peer}|{uuid.uuid4().hex}"
    held: list[str] = []
    try:
        for origin in sorted(set(origins)):
            key = state.federation_lock_key(origin)
            turn = state.federation_turn_key(origin)
            deadline = time.monotonic() + _LOCK_WAIT_S
            while not await r.eval(
                _LOCK_TAKE, 2, key, turn, token, peer, _LOCK_TTL_MS, _TURN_TTL_MS
            ):
                if time.monotonic() > deadline:
                    raise InboundBusy(f"notifications from {origin} are being stored for long")
                await asyncio.sleep(0.005)
            held.append(key)
        yield
    finally:
        for key in held:
            with contextlib.suppress(RedisError):
                await r.eval(_UNLOCK, 1, key, token)


async def federation_accept(
    *, peer: str, notifications: list[wsn.NotificationIn], ids: list[str], message_id: str | None
) -> int:
    """Store what a peer pushed, each notification once however often and by however many peers
    it arrives; returns how many were new. Each is stored with the path it has passed
    (peers.origin_producer), which keeps it from being forwarded back or twice.

    A direct peer's notifications are taken from that peer only (peers.relayed_copy_of_peer):
    a copy another peer relays is dropped and answered as stored, so that peer does not retry
    it. Those of other origins are stored as the first peer to bring them pushes them.

    A push past the peer's HPWSN_FEDERATION_INBOUND_RATE is InboundLimited, one on a topic this
    site holds no link for at the peer NotAuthorized: nothing of either is stored.
    """
    if len(ids) != len(notifications):  # not an HPwsn peer: the push's own id, per message
        ids = [f"{message_id}#{index}" for index in range(len(notifications))]
    own = settings.HPWSN_SITE_NAME
    direct = {p.name for p in settings.HPWSN_FEDERATION_PEERS}
    r = state.get_async_redis()
    # Before anything is held: a peer pushing past its rate is refused before it can keep an
    # origin's lock from the others.
    await _rate_take(r, peer, len(notifications))
    await _topics_check(peer, notifications)
    # Messages already stored from an earlier push (the sender's answer was lost, and its retry
    # cut the batch differently) are dropped by their push id.
    try:
        seen = await r.mget([state.federation_seen_key(peer, i) for i in ids])
    except RedisError:  # the log's idempotency key below still catches an identical batch
        seen = [None] * len(ids)
    todo: list[_Inbound] = []
    for push_id, n, done in zip(ids, notifications, seen, strict=True):
        if done is not None:
            continue
        origin = origin_of(wsn.producer_address(n))
        path = relay_path(origin, peer=peer, own=own)
        if path is None:  # it has been here: a loop the link filters should have stopped
            log.info("federation: dropped a notification from %s that passed here", peer)
            continue
        if relayed_copy_of_peer(path, peer=peer, peers=direct):
            continue
        origin_id = origin.id if origin is not None else _own_id(push_id, n)
        todo.append(_Inbound(push_id=push_id, notification=n, path=path, origin_id=origin_id))
    if not todo:
        return 0
    # The peer's own notifications have one way in, this link (their copies relayed by others
    # are dropped above): nothing to claim, nothing can overtake them. So has everything a site
    # with a single peer is pushed.
    relayed = [t for t in todo if t.path[0] != peer] if len(direct) > 1 else []
    if not relayed:
        return await _store(r, peer, todo, claims=[1] * len(todo))
    # The origin's lock makes "claimed by another peer" mean "stored by it": a notification
    # dropped as a duplicate is stored before anything newer from the same origin is. This
    # orders an origin's notifications only among the copies that reach this site: one that
    # comes by two ways, each retried on its own, may still be stored newest first.
    async with _origins_locked(r, (t.path[0] for t in relayed), peer=peer):
        claimed = iter(await _claim(r, peer, relayed))
        claims = [next(claimed) if t.path[0] != peer else 1 for t in todo]
        return await _store(r, peer, todo, claims=claims)


async def _store(r: Any, peer: str, todo: list[_Inbound], *, claims: list[int]) -> int:
    """Store the messages `claims` (see _CLAIM) lets through; how many were new."""
    fresh = [t for t, c in zip(todo, claims, strict=True) if c]
    if not fresh:
        return 0
    for t in fresh:
        t.notification.producer_xml = _producer_xml(origin_producer(t.path, t.origin_id))
    try:
        # One accept for the whole batch (one transaction, one Redis script): its key is made
        # of the push ids, so the same batch pushed again is stored once.
        await notifications_accept(
            notifications=[t.notification for t in fresh],
            principal=peer_principal(peer),
            idempotency_key=f"federation|{peer}|"
            + hashlib.sha256(",".join(t.push_id for t in fresh).encode()).hexdigest(),
        )
    except BaseException:
        # Not stored: another peer's copy may be taken.
        made = {_origin_key(t) for t, c in zip(todo, claims, strict=True) if c == 2}
        with contextlib.suppress(RedisError):
            if made:
                await r.delete(*made)
        raise
    with contextlib.suppress(RedisError):
        pipe = r.pipeline(transaction=False)
        for t in fresh:
            pipe.set(state.federation_seen_key(peer, t.push_id), 1, ex=_seen_window())
        await pipe.execute()
    return len(fresh)


def _origin_key(t: _Inbound) -> str:
    return state.federation_origin_key(t.path[0], t.origin_id)


async def _claim(r: Any, peer: str, todo: list[_Inbound]) -> list[int]:
    """Per message: 0 drop it, 1 or 2 store it (see _CLAIM)."""
    keys = [state.federation_seen_key(peer, t.push_id) for t in todo]
    keys += [_origin_key(t) for t in todo]
    try:
        return [int(c) for c in await r.eval(_CLAIM, len(keys), *keys, peer, _dedup_window())]
    except RedisError:  # the accept below needs Redis too; the idempotency key still holds
        return [1] * len(todo)


def _dedup_window() -> int:
    return max(int(settings.HPWSN_DEDUP_WINDOW_S), 1)


def _seen_window() -> int:
    """How long a stored message's push id is remembered: the dedup window, and at least as long
    as the signature of the push that brought it is taken (from SIGNATURE_TOLERANCE_S before its
    timestamp to as long after), so a recorded push sent again meanwhile is not stored again."""
    return max(_dedup_window(), 2 * SIGNATURE_TOLERANCE_S)
