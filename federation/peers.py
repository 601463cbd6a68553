"""Federation of sites, the pure part: peers, interest, the provenance of a forwarded message.

A notification forwarded from one site to another is republished at the receiver with the
ProducerReference `urn:hpwsn:federation:<origin site>:<origin id>`. That address is what keeps
forwarding to one hop: every link subscription carries a ProducerProperties filter that refuses
it, so a forwarded notification is delivered to the receiver's own subscribers and never sent
on (no loop, whatever the topology of the peer lists); and its origin id is the receiver's
idempotency key, so a notification that arrives twice (a retried push) is stored once.

No Django here.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass

URN_PREFIX = "urn:hpwsn:federation:"
# The ProducerProperties filter (SQL-like dialect) of every link: nothing forwarded goes on.
LINK_FILTER = f"$producer IS NULL OR $producer NOT LIKE '{URN_PREFIX}%'"
INBOUND_PATH = "/federation/in/"
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


@dataclass(frozen=True)
class Peer:
    name: str
    url: str  # the peer's base URL: its SOAP endpoint is url + "/wsn/"

    @property
    def endpoint(self) -> str:
        return self.url + "/wsn/"


def site_name_check(name: str) -> str:
    """A site name: lower-case letters, digits and dashes (it goes into URLs and URNs)."""
    if not _NAME.match(name):
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


def interest_reduce(paths: Iterable[str]) -> list[str]:
    """The topic paths that cover all of these, none inside another's subtree (sorted).

    A subscription to a topic receives its whole subtree, so a peer subscribed to ALL and to
    ALL:ALARM would be sent an alarm twice: only ALL is kept.
    """
    kept: list[str] = []
    for path in sorted(set(p for p in paths if p)):
        if not any(path == k or path.startswith(k + ":") for k in kept):
            kept.append(path)
    return kept


def inbound_token(secret: str, peer: str) -> str:
    """The secret part of the address a peer pushes to: only this site can make it."""
    return hmac.new(secret.encode(), f"federation-in:{peer}".encode(), hashlib.sha256).hexdigest()[
        :40
    ]


def inbound_url(own_url: str, peer: str, secret: str) -> str:
    """Where `peer` pushes what this site's subscribers want."""
    return f"{own_url.rstrip('/')}{INBOUND_PATH}{peer}/{inbound_token(secret, peer)}/"


def origin_producer(site: str, notification_id: str) -> str:
    """The ProducerReference address of a notification forwarded from `site`."""
    return f"{URN_PREFIX}{site}:{notification_id}"


def origin_of(producer: str | None) -> tuple[str, str] | None:
    """(origin site, origin id) of a forwarded notification's producer address, else None."""
    if not producer or not producer.startswith(URN_PREFIX):
        return None
    site, sep, nid = producer[len(URN_PREFIX) :].partition(":")
    return (site, nid) if sep and site and nid else None
