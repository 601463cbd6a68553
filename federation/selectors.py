"""Reads of the federation: what this site's subscribers want, and how its peers are doing."""

from __future__ import annotations

import json
import time
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from federation.models import Link
from federation.peers import INBOUND_PATH, Interest, expression_interest
from hpwsn import topicexpr
from hpwsn_site import state
from subscriptions.models import Subscription
from topics.selectors import topic_tree


def interest_held() -> list[Interest]:
    """The topic subtrees wanted here: this site's own subscribers', and its peers' links.

    A peer's link states the path its interest came through (hpwsn:InterestPath); a link made
    by a site that does not relay states none and is no reason to ask the others for anything.
    A wildcard subscription (no topic_path) wants the subtrees its patterns lie in
    (peers.expression_interest).
    """
    now = timezone.now()
    live = Subscription.objects.filter(
        Q(termination_time__isnull=True) | Q(termination_time__gt=now)
    )
    rows = live.exclude(topic_path="").values_list(
        "topic_path", "interest_path", "site_peers", "consumer_address"
    )
    held: set[Interest] = set()
    for topic, path, peers, consumer in rows:
        if path:
            held.add(Interest(topic=topic, path=tuple(path), peers=tuple(sorted(peers))))
        elif INBOUND_PATH not in consumer:
            held.add(Interest(topic=topic))
    # Links are concrete; a wildcard one at an inbound address would be no subscriber's.
    wild = (
        live.filter(topic_path="")
        .exclude(consumer_address__contains=INBOUND_PATH)
        .order_by()  # the model's ordering would make rows of one expression distinct
        .values_list("topic_expression", "topic_dialect", "topic_nsmap")
        .distinct()
    )
    tree = topic_tree()
    for text, dialect, nsmap in wild:
        expression = None
        if text:
            try:
                expression = topicexpr.parse(text, dialect, nsmap)
            except (topicexpr.TopicExpressionError, topicexpr.UnknownDialectError):
                continue  # validated at subscribe time; unreachable unless the row was edited
        held.update(Interest(topic=topic) for topic in expression_interest(expression, tree))
    return sorted(held, key=lambda i: (i.topic, i.path))


def link_topics(*, peer: str) -> list[str]:
    """The topic paths this site holds links for at `peer`: the subtrees it may push here."""
    return sorted(Link.objects.filter(peer=peer).values_list("topic_path", flat=True))


def peers_status(*, now: float | None = None) -> list[dict[str, Any]]:
    """Each configured peer: up or down, when it last answered, its links, its last error."""
    now = time.time() if now is None else now
    raw = state.get_redis().hgetall(state.FEDERATION_PEERS)
    out = []
    for peer in settings.HPWSN_FEDERATION_PEERS:
        rec: dict[str, Any] = json.loads(raw.get(peer.name.encode(), b"{}"))
        last_ok = rec.get("last_ok")
        age = None if last_ok is None else max(now - float(last_ok), 0.0)
        up = age is not None and age < settings.HPWSN_FEDERATION_DEAD_AFTER_S
        out.append(
            {
                "name": peer.name,
                "url": peer.url,
                "state": "up" if up else "down",
                "last_ok_age_s": None if age is None else round(age, 1),
                "links": rec.get("links", []),
                "last_error": rec.get("last_error", ""),
            }
        )
    return out
