"""Federation of sites, the pure part: peers, interest and its path, a forwarded message's path.

A notification forwarded from one site to another is republished at the receiver with the
ProducerReference `urn:hpwsn:federation:/<origin>/<site>/.../<receiver>/:<origin id>`: the sites
it has passed, origin first, the receiver last, then the id it has at its origin. Each link a
site X holds at a peer carries a ProducerProperties filter that refuses what has passed X
(`link_filter`), so nothing is forwarded back to a site it has been at, whatever the topology;
the receiver drops a notification whose path holds its own name.

A notification whose origin is a direct peer of the receiver is taken from that peer's own link
only (`relayed_copy_of_peer`): that link carries the origin's notifications in the order the
origin took them, through its log and retries, so a relayed copy (which may overtake a retry of
an older one) is refused at the relaying site by the link filter, and dropped by the receiver if
it comes all the same. Notifications of other origins are stored once per (origin site, origin
id), whichever peer brings them first (federation/services.py).

The interest a site asks a peer for carries its path too (`Interest`): its own subscribers'
topics (for a wildcard expression the subtrees its patterns lie in, `expression_interest`), and
the topics its other peers hold here, each with the sites it came through. A site relays to a
peer only interest that has not passed that peer, with its own name appended, and no path
longer than MAX_PATH sites: interest travels along simple paths, so in a ring it dies out once
the subscribers that held it are gone.

No Django here.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote

from hpwsn import wsn
from hpwsn.topicexpr import TopicExpression
from topics.tree import TopicTree, fixed_names
from topics.trie import ns_ok, root_constraint

URN_PREFIX = "urn:hpwsn:federation:"
INBOUND_PATH = "/federation/in/"
# Sites an interest path may hold: interest that would pass more is not relayed.
MAX_PATH = 8
# How far a signed push's time may be from the receiver's clock (the Standard Webhooks default).
SIGNATURE_TOLERANCE_S = 300
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
# An origin id as it is kept in the URN: no "/" (the path's delimiter, which the link filter's
# LIKE pattern relies on), bounded. HPwsn's ids are 32 hex digits (`<id>:<n>` for a fragment).
_ORIGIN_ID = re.compile(r"^[A-Za-z0-9._:#-]{1,128}$")


@dataclass(frozen=True)
class Peer:
    name: str
    url: str  # the peer's base URL: its SOAP endpoint is url + "/wsn/"

    @property
    def endpoint(self) -> str:
        return self.url + "/wsn/"


def site_name_check(name: str) -> str:
    """A site name: lower-case letters, digits and dashes (it goes into URLs and URNs)."""
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"site name {name!r}: use 1-63 lower-case letters, digits and dashes, "
            "starting with a letter or digit"
        )
    return name


def peers_parse(text: str, *, own: str) -> tuple[Peer, ...]:
    """`HPWSN_FEDERATION_PEERS`: `name=http://host:port,name=...`; a precise error otherwise."""
    peers: dict[str, Peer] = {}
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        name, sep, url = item.partition("=")
        name, url = name.strip(), url.strip().rstrip("/")
        if not sep or not url.startswith(("http://", "https://")):
            raise ValueError(f"HPWSN_FEDERATION_PEERS: {item!r} is not name=http(s)://host:port")
        site_name_check(name)
        if name == own:
            raise ValueError(f"HPWSN_FEDERATION_PEERS: {name!r} is this site's own name")
        if name in peers:
            raise ValueError(f"HPWSN_FEDERATION_PEERS: {name!r} is named twice")
        peers[name] = Peer(name=name, url=url)
    return tuple(peers.values())


@dataclass(frozen=True)
class Credentials:
    """The directory account this site's links use at one peer (HTTP Basic)."""

    user: str
    password: str = field(repr=False)


def credentials_parse(text: str, *, peers: Iterable[str]) -> dict[str, Credentials]:
    """`HPWSN_FEDERATION_CREDENTIALS`: `peer=user:password,...`, each part percent-decoded (a
    password may hold any character written as %XX); a precise error otherwise, which never
    repeats a password."""
    known = set(peers)
    out: dict[str, Credentials] = {}
    for number, raw in enumerate(text.split(","), start=1):
        item = raw.strip()
        if not item:
            continue
        name, sep, account = item.partition("=")
        name = name.strip()
        where = f"HPWSN_FEDERATION_CREDENTIALS: entry {number}"
        user, colon, password = account.partition(":")
        user, password = unquote(user.strip()), unquote(password)
        if not sep or not colon or not user or not password:
            # Without "=" the entry may be an account and its password: not repeated.
            label = f" ({name})" if sep and _NAME.fullmatch(name) else ""
            raise ValueError(f"{where}{label} is not peer=user:password")
        if name not in known:
            raise ValueError(f"{where}: {name!r} is not a peer in HPWSN_FEDERATION_PEERS")
        if name in out:
            raise ValueError(f"{where}: {name!r} is named twice")
        if any(c in user for c in ":\r\n") or any(c in password for c in "\r\n"):
            raise ValueError(f"{where} ({name}): a line break, or a ':' in the user")
        out[name] = Credentials(user=user, password=password)
    return out


def group_check(name: str) -> str:
    """`HPWSN_FEDERATION_GROUP`: a group name as topic policies list them (case-folded)."""
    group = name.strip().casefold()
    if not group or group == "*" or any(c in group for c in ",\r\n"):
        raise ValueError(f"HPWSN_FEDERATION_GROUP: {name!r} is not a group name")
    return group


def interest_reduce(paths: Iterable[str]) -> list[str]:
    """The topic paths that cover all of these, none inside another's subtree (sorted).

    A subscription to a topic receives its whole subtree, so a peer subscribed to ALL and to
    ALL:ALARM would be sent an alarm twice: only ALL is kept.
    """
    kept: set[str] = set()
    # A path sorts after its ancestors, so each is checked against the kept ones above it: its
    # prefixes, not every kept path (10^4 sibling topics took 10^8 comparisons).
    for path in sorted(set(p for p in paths if p)):
        if _kept_above(path, kept) is None:
            kept.add(path)
    return sorted(kept)


def _kept_above(path: str, kept: set[str]) -> str | None:
    """The topic of `kept` that is `path` or one of its ancestors, if any."""
    at = path.find(":")
    while at != -1:
        if path[:at] in kept:
            return path[:at]
        at = path.find(":", at + 1)
    return path if path in kept else None


def inbound_token(secret: str, peer: str) -> str:
    """The secret part of the address a peer pushes to: only this site can make it."""
    return hmac.new(secret.encode(), f"federation-in:{peer}".encode(), hashlib.sha256).hexdigest()[
        :40
    ]


def link_signing_secret(secret: str, peer: str) -> str:
    """The SigningSecret this site's links at `peer` carry: the peer signs every push with it
    (Standard Webhooks), and only this site can make it."""
    key = hmac.new(secret.encode(), f"federation-sign:{peer}".encode(), hashlib.sha256).digest()
    return "whsec_" + base64.b64encode(key).decode()


def inbound_url(own_url: str, peer: str, secret: str) -> str:
    """Where `peer` pushes what this site's subscribers want."""
    return f"{own_url.rstrip('/')}{INBOUND_PATH}{peer}/{inbound_token(secret, peer)}/"


def origin_id_clean(raw: str) -> str:
    """An origin id fit for the URN: kept as it is when it can be, else a digest of it.

    A peer that is not HPwsn names its messages by its wsa:MessageID, which may hold anything;
    the digest is the same for the same id, so a resent message is still recognised.
    """
    if _ORIGIN_ID.fullmatch(raw):
        return raw
    return "h-" + hashlib.sha256(raw.encode()).hexdigest()[:40]


@dataclass(frozen=True)
class Origin:
    """Where a forwarded notification comes from: its path (origin first) and its origin id."""

    path: tuple[str, ...]
    id: str

    @property
    def site(self) -> str:
        return self.path[0]


def origin_producer(path: Sequence[str], origin_id: str) -> str:
    """The ProducerReference address of a notification that has passed these sites."""
    return f"{URN_PREFIX}/{'/'.join(path)}/:{origin_id}"


def origin_of(producer: str | None) -> Origin | None:
    """The origin a forwarded notification's producer address states, else None.

    An address in the federation's namespace that does not parse is None too: whoever wrote
    it, it is not a path this site can trust. The form of sites before relaying,
    `urn:hpwsn:federation:<origin>:<id>`, reads as a path of the origin alone.
    """
    if not producer or not producer.startswith(URN_PREFIX):
        return None
    rest = producer[len(URN_PREFIX) :]
    if not rest.startswith("/"):
        site, sep, nid = rest.partition(":")
        if not sep or not _NAME.fullmatch(site) or not nid:
            return None
        return Origin(path=(site,), id=origin_id_clean(nid))
    end = rest.find("/:")
    if end < 1:
        return None
    path = tuple(rest[1:end].split("/"))
    nid = rest[end + 2 :]
    if (
        not all(_NAME.fullmatch(site) for site in path)
        or len(set(path)) != len(path)
        or not _ORIGIN_ID.fullmatch(nid)
    ):
        return None
    return Origin(path=path, id=nid)


def relay_path(origin: Origin | None, *, peer: str, own: str) -> tuple[str, ...] | None:
    """The path a notification pushed by `peer` is stored with here, or None: drop it.

    A notification the peer did not get from elsewhere starts its path at the peer. A site
    before relaying did not write itself at the end: it is appended. A path that has been here
    already, or that would pass the peer twice, is a loop: dropped (the link filters keep such
    a notification from being sent; this is the receiver's own guard).
    """
    path = origin.path if origin is not None else (peer,)
    if path[-1] != peer:
        path = (*path, peer)
    if own in path or len(set(path)) != len(path):
        return None
    return (*path, own)


def producer_reserved(n: wsn.NotificationIn) -> str | None:
    """The address of a publisher's ProducerReference if it is one only a federation writes.

    A publisher that wrote one could make other sites drop real notifications as duplicates,
    or steer where its own go: its Notify is refused.
    """
    if URN_PREFIX.encode() not in n.producer_xml:  # most messages: no parsing
        return None
    address = wsn.producer_address(n) or ""
    return address if address.startswith(URN_PREFIX) else None


def relayed_copy_of_peer(path: Sequence[str], *, peer: str, peers: Collection[str]) -> bool:
    """Whether a notification `peer` pushed, with this path, is a copy of what another of this
    site's direct peers published: its origin's own link brings it, so this copy is dropped.

    The origin's link is the one way its notifications come here in the order it took them (its
    log and retries keep it across an outage here); a copy relayed by a third site could overtake
    a retry of an older one. Dropping the copy keeps at-least-once: the origin's pump goes on
    pushing to this site until each of its notifications is answered.
    """
    return path[0] != peer and path[0] in peers


def link_filter(site: str, *, others: Iterable[str] = ()) -> str:
    """The ProducerProperties filter (SQL-like dialect) of a link `site` holds at a peer.

    It lets through the peer's own notifications and those forwarded to it that have not passed
    `site` and whose origin is none of `others`: the other direct peers of `site`, whose
    notifications come by their own links (relayed_copy_of_peer), in the current address form
    and in the form of sites before relaying (`urn:hpwsn:federation:<origin>:<id>`). Site names
    hold no "/", ":" nor LIKE wildcards, and an origin id no "/", so `/<site>/` matches that name
    in the path exactly, and `/<origin>/` or `<origin>:` after the prefix the origin exactly,
    never a prefix or a suffix of another name.
    """
    site_name_check(site)
    clauses = [f"$producer NOT LIKE '{URN_PREFIX}%/{site}/%'"]
    for origin in sorted(set(others)):
        site_name_check(origin)
        clauses.append(f"$producer NOT LIKE '{URN_PREFIX}/{origin}/%'")
        clauses.append(f"$producer NOT LIKE '{URN_PREFIX}{origin}:%'")
    if len(clauses) == 1:  # a site with one peer: the text its links have always had
        return f"$producer IS NULL OR {clauses[0]}"
    return f"$producer IS NULL OR ({' AND '.join(clauses)})"


@dataclass(frozen=True)
class Interest:
    """A topic subtree wanted here, and the path of sites it came through (empty: this site's
    own subscribers hold it; else the peer that holds it here is last)."""

    topic: str
    path: tuple[str, ...] = ()
    # The other peers of the site that holds it here (its link's hpwsn:Peers): that site asks
    # them for this interest itself, so this one does not.
    peers: tuple[str, ...] = ()


def expression_interest(expression: TopicExpression | None, tree: TopicTree) -> set[str]:
    """The topics of this site's tree whose subtrees hold all a subscription with this expression
    (None: no TopicExpression, every topic) can be sent.

    A pattern's leading `/name` steps (topics.tree.fixed_names) name the subtree it lies in: that
    topic, or its deepest ancestor in this tree when it is not here (a topic a peer has and this
    site lacks may still be created here as the topic policy says). A pattern with no such step
    (`*`, `//x`, `*/a`) may select topics under any root: every root its first step admits. The
    receiving site matches what comes by the subscriber's own expression, so a wider subtree
    costs traffic, never a wrong delivery. Topic paths carry no namespace, as a concrete
    subscription's topic_path does.
    """
    roots = [tree.by_names[(name,)] for name in tree.children(())]
    if expression is None:
        return {root.path for root in roots}
    out: set[str] = set()
    for pattern in expression.patterns:
        first = pattern.steps[0]
        names = fixed_names(pattern.steps)
        if not names:
            constraint = None if first.descendant else root_constraint(pattern)
            out.update(root.path for root in roots if ns_ok(constraint, root.root_namespace))
            continue
        for k in range(len(names), 0, -1):
            node = tree.resolve(first.namespace, names[:k], pattern.any_namespace)
            if node is not None:
                out.add(node.path)
                break
    return out


def interest_path_check(sites: Sequence[str]) -> tuple[str, ...]:
    """An interest path as a peer states it: 1 to MAX_PATH site names, none twice."""
    if not sites:
        raise ValueError("an InterestPath names at least one site")
    return _sites_check(sites, "an InterestPath", most=MAX_PATH)


MAX_PEERS = 64


def site_peers_check(sites: Sequence[str]) -> tuple[str, ...]:
    """A peer site's list of its other peers as its link states it: site names, none twice."""
    return _sites_check(sites, "hpwsn:Peers", most=MAX_PEERS)


def _sites_check(sites: Sequence[str], what: str, *, most: int) -> tuple[str, ...]:
    if len(sites) > most:
        raise ValueError(f"{what} holds at most {most} sites, not {len(sites)}")
    for site in sites:
        site_name_check(site)
    if len(set(sites)) != len(sites):
        raise ValueError(f"{what} names a site twice")
    return tuple(sites)


def interest_for_peer(
    interest: Iterable[Interest], *, own: str, peer: str
) -> dict[str, tuple[str, ...]]:
    """What this site asks `peer` for: topic path -> the interest path its link states.

    Interest that has passed the peer is not asked for there (it would come back the way it
    came), nor interest whose holder here is a peer of that peer too (it asks there itself: in a
    full mesh nothing is asked for on another's behalf), nor interest whose path would exceed
    MAX_PATH with this site appended. Topics are reduced as interest_reduce does, so the peer
    sends each notification once; a kept topic states the shortest path of the interest it
    covers (ties: the first in order), which excludes the fewest sites from relaying it on.
    """
    paths: dict[str, list[tuple[str, ...]]] = {}
    for item in interest:
        if peer in item.path or peer in item.peers or own in item.path:
            continue
        if len(item.path) + 1 > MAX_PATH:
            continue
        paths.setdefault(item.topic, []).append((*item.path, own))
    kept = set(interest_reduce(paths))
    covered: dict[str, list[tuple[str, ...]]] = {}
    for topic, found in paths.items():
        above = _kept_above(topic, kept)
        assert above is not None  # every topic is kept or below a kept one
        covered.setdefault(above, []).extend(found)
    return {topic: min(covered[topic], key=lambda p: (len(p), p)) for topic in sorted(covered)}
