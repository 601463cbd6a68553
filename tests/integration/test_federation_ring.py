"""A ring of four federated sites on one machine: a-b-c-d-a, each site peered with its two
neighbours only. Opposite sites (a and c, b and d) are not peers: each notification between them
can travel two ways round, and does, so what the ring tests is that the receiving site stores it
once (by its stable id), that its subscribers get it once, and that nothing goes round and
round. Each site is its own database, Redis, web, worker and beat, configured only
through the documented variables, as in test_federation.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from tests.integration import test_federation
from tests.integration.test_federation import (
    _peers,
    delta,
    host_port,
    publish_everywhere,
    settled,
    start_sites,
)
from tests.integration.test_kill import KillPlatform
from tests.support import wait_until

pytestmark = pytest.mark.integration

subscribe = test_federation.subscribe  # the fixture

SITES = ("a", "b", "c", "d")
NEIGHBOURS = {s: (SITES[i - 1], SITES[(i + 1) % len(SITES)]) for i, s in enumerate(SITES)}
COUNT = 10


@pytest.fixture(scope="module")
def ring(tmp_path_factory) -> Iterator[dict[str, KillPlatform]]:  # type: ignore[no-untyped-def]
    with contextlib.ExitStack() as stack:
        yield start_sites(stack, tmp_path_factory, NEIGHBOURS, prefix="ring")


def _asks(ring: dict[str, KillPlatform], site: str, peer: str, topic: str) -> bool:
    rec = _peers(ring[site]).get(peer, {})
    return topic in rec.get("links", []) and not rec.get("last_error")


def test_in_a_ring_of_four_each_subscriber_gets_each_notification_once_and_in_order(
    ring, consumer_factory, subscribe
):
    consumers = {name: consumer_factory() for name in SITES}
    for name, c in consumers.items():
        subscribe(ring[name], c.url, "ALL1")
    # Every site asks both its neighbours for ALL1 (for its own subscriber, and for the far ones).
    assert wait_until(
        lambda: all(_asks(ring, s, p, "ALL1") for s in SITES for p in NEIGHBOURS[s]),
        timeout=90,
        interval=0.5,
    ), {name: _peers(s) for name, s in ring.items()}
    before = settled(ring)

    want = publish_everywhere(ring, consumers, "ring4", COUNT, timeout=90)
    # Nothing still going round: every site's counters stay the same over several sync rounds.
    after = settled(ring)

    for name, c in consumers.items():
        assert sorted(c.payload_texts()) == want, name
        # In order: its own site's and its neighbours' (they come by one link each). The
        # opposite site's come both ways round, in order only while neither way stalls, which
        # docs/deployment.md says is not guaranteed: here they are checked for once each only.
        for origin in (name, *NEIGHBOURS[name]):
            mine = [t for t in c.payload_texts() if t.startswith(f"ring4-{origin}-")]
            assert mine == [f"ring4-{origin}-{k}" for k in range(COUNT)], (name, origin)
        # Each site stored each notification once, however many ways it came.
        assert delta(after[name], before[name], "accepted:ALL1") == len(SITES) * COUNT, name
        for peer in NEIGHBOURS[name]:
            # Pushed to a neighbour once each: its own and its other neighbour's. Not what the
            # site opposite published (the neighbour is that site's peer: its link here says so,
            # and it gets those from there), and nothing back to where it came from.
            pushed = delta(after[name], before[name], f"delivered:{host_port(ring[peer])}")
            assert pushed == 2 * COUNT, (name, peer, pushed)
