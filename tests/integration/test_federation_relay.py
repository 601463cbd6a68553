"""Relaying through an intermediate site: four federated sites on one machine, as a star.

Site b is the hub, peered with a, c and d; a, c and d are peered with b only. So a-b-c is a line
(a and c are not peers: everything between them goes through b), and a, c, d are the leaves of
a star. Each site is its own database, Redis, web, worker and beat, configured only through the
documented variables, as in test_federation.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from tests.integration import test_federation
from tests.integration.test_federation import (
    _peers,
    _publish,
    delta,
    host_port,
    settled,
    start_sites,
)
from tests.integration.test_kill import KillPlatform
from tests.support import wait_until

pytestmark = pytest.mark.integration

subscribe = test_federation.subscribe  # the fixture

HUB = "b"
LEAVES = ("a", "c", "d")
SITES = (HUB, *LEAVES)
COUNT = 10


@pytest.fixture(scope="module")
def star(tmp_path_factory) -> Iterator[dict[str, KillPlatform]]:  # type: ignore[no-untyped-def]
    with contextlib.ExitStack() as stack:
        yield start_sites(
            stack,
            tmp_path_factory,
            {HUB: LEAVES, **{leaf: (HUB,) for leaf in LEAVES}},
            prefix="star",
        )


def _stated(star: dict[str, KillPlatform], site: str, peer: str) -> dict[str, str]:
    """Topic path -> the interest path (sites joined by "/") of each link `site` holds at `peer`."""
    rec = _peers(star[site]).get(peer, {})
    return dict(rec.get("paths", {})) if not rec.get("last_error") else {}


def test_in_a_line_each_end_gets_what_the_other_publishes_once_and_in_order(
    star, consumer_factory, subscribe
):
    at_a, at_c = consumer_factory(), consumer_factory()
    subscribe(star["a"], at_a.url, "ALL3")
    subscribe(star["c"], at_c.url, "ALL2")
    # c's interest reaches a through b (b relays it, its path c/b), and a's reaches c; the hub
    # relays neither end's interest back to it.
    # (d publishes nothing: what b asks of it brings nothing.)
    assert wait_until(
        lambda: (
            _stated(star, "b", "a") == {"ALL2": "c/b"}
            and _stated(star, "b", "c") == {"ALL3": "a/b"}
            and _stated(star, "b", "d") == {"ALL2": "c/b", "ALL3": "a/b"}
            and _stated(star, "a", "b") == {"ALL3": "a"}
            and _stated(star, "c", "b") == {"ALL2": "c"}
        ),
        timeout=60,
        interval=0.5,
    ), {name: _peers(s) for name, s in star.items()}
    before = settled(star)

    for k in range(COUNT):
        _publish(star["a"], "ALL2", f"a-{k}")
        _publish(star["c"], "ALL3", f"c-{k}")
    want_c = [f"a-{k}" for k in range(COUNT)]
    want_a = [f"c-{k}" for k in range(COUNT)]
    assert wait_until(
        lambda: len(at_c.payload_texts()) >= COUNT and len(at_a.payload_texts()) >= COUNT,
        timeout=60,
        interval=0.5,
    ), (at_a.payload_texts(), at_c.payload_texts())
    after = settled(star)

    assert at_c.payload_texts() == want_c
    assert at_a.payload_texts() == want_a
    # Through b and on, once each: b stored each, and pushed each on to the far end only.
    assert delta(after["b"], before["b"], "accepted:ALL2") == COUNT
    assert delta(after["b"], before["b"], "accepted:ALL3") == COUNT
    assert delta(after["c"], before["c"], "accepted:ALL2") == COUNT
    assert delta(after["a"], before["a"], "accepted:ALL3") == COUNT
    for src, dst in (("a", "b"), ("c", "b"), ("b", "a"), ("b", "c")):
        assert delta(after[src], before[src], f"delivered:{host_port(star[dst])}") == COUNT


def test_in_a_star_a_leafs_notifications_reach_every_other_leaf_once_and_never_come_back(
    star, consumer_factory, subscribe
):
    consumers = {leaf: consumer_factory() for leaf in LEAVES}
    for leaf, c in consumers.items():
        subscribe(star[leaf], c.url, "ALL1")
    # Each leaf's interest reaches the two others through the hub: the hub's link at a leaf
    # states the shortest of the other leaves' paths, the first in order of those as short.
    hub_at = {"a": "c/b", "c": "a/b", "d": "a/b"}
    assert wait_until(
        lambda: (
            all(_stated(star, HUB, leaf) == {"ALL1": hub_at[leaf]} for leaf in LEAVES)
            and all(_stated(star, leaf, HUB) == {"ALL1": leaf} for leaf in LEAVES)
        ),
        timeout=60,
        interval=0.5,
    ), {name: _peers(s) for name, s in star.items()}
    before = settled(star)

    for k in range(COUNT):
        _publish(star["a"], "ALL1", f"star-{k}")
    want = [f"star-{k}" for k in range(COUNT)]
    assert wait_until(
        lambda: all(len(c.payload_texts()) >= COUNT for c in consumers.values()),
        timeout=60,
        interval=0.5,
    ), {leaf: c.payload_texts() for leaf, c in consumers.items()}
    after = settled(star)

    for leaf, c in consumers.items():
        assert c.payload_texts() == want, leaf
        assert delta(after[leaf], before[leaf], "accepted:ALL1") == COUNT, leaf
    assert delta(after[HUB], before[HUB], "accepted:ALL1") == COUNT
    # a pushed each to the hub once; the hub on to c and d once each, and never back to a.
    assert delta(after["a"], before["a"], f"delivered:{host_port(star[HUB])}") == COUNT
    for leaf, pushed in (("c", COUNT), ("d", COUNT), ("a", 0)):
        assert delta(after[HUB], before[HUB], f"delivered:{host_port(star[leaf])}") == pushed
