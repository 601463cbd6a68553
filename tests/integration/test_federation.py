"""Three federated sites on one machine, each its own database, Redis, web, worker and beat.

Configured only through the documented variables (HPWSN_SITE_NAME, HPWSN_FEDERATION_PEERS,
HPWSN_FEDERATION_URL, HPWSN_FEDERATION_SYNC_S). Each site peers with the two others: a full
mesh, which with three sites is also a ring. A site relays no interest here: each link names its
holder's other peers, which the holder asks itself. Every notification travels by its origin's
own link only: a link refuses what the holder's other peers published, and a copy that came
relayed all the same would be dropped.
The thesis's tests (chapter 6):

- 功能-02: a subscriber at each site receives ALL1, ALL2 and ALL3, published at the three sites;
- 功能-06: ALL, ALL:ALARM and ALL:ALARM:ALARM1 subscribed at three different sites receive
  exactly their subtrees of what is published anywhere;

each notification exactly once per subscriber (nothing loops back, nothing comes twice). Lines
and stars, where notifications are relayed: test_federation_relay.py; a ring of four, where they
come two ways round: test_federation_ring.py.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from hpwsn import ns
from tests.integration.test_kill import KillPlatform, private_platform
from tests.support import (
    RecordingConsumer,
    free_port,
    notify_xml,
    soap_call,
    subscribe_xml,
    wait_until,
)

pytestmark = pytest.mark.integration

SITES = ("a", "b", "c")
FRAGMENT_SIZE = 4096


def start_sites(
    stack: contextlib.ExitStack,
    tmp_path_factory: pytest.TempPathFactory,
    peers: Mapping[str, Sequence[str]],
    *,
    prefix: str,
    env: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, KillPlatform]:
    """Start a site per name of `peers`, each peered with the sites it names (and `env[name]`
    added to its environment), on the stack."""
    ports = {name: free_port() for name in peers}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    return {
        name: stack.enter_context(
            private_platform(
                tmp_path_factory.mktemp(f"{prefix}-{name}"),
                node_name=f"{prefix}-{name}",
                http_port=ports[name],
                HPWSN_SITE_NAME=name,
                HPWSN_FEDERATION_PEERS=",".join(f"{p}={urls[p]}" for p in peers[name]),
                HPWSN_FEDERATION_URL=urls[name],
                HPWSN_FEDERATION_SYNC_S="0.5",
                HPWSN_FEDERATION_DEAD_AFTER_S="3",
                # A peer that is down for a while is retried for a minute, not dead-lettered.
                HPWSN_RETRY_SCHEDULE_S=",".join(["1"] * 60),
                **(env or {}).get(name, {}),
            )
        )
        for name in peers
    }


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> Iterator[dict[str, KillPlatform]]:  # type: ignore[no-untyped-def]
    with contextlib.ExitStack() as stack:
        yield start_sites(
            stack,
            tmp_path_factory,
            {name: [p for p in SITES if p != name] for name in SITES},
            prefix="site",
            # Site a pushes anything over 4 KiB as fragments (功能-03/04), to its peers too; b
            # and c push whole messages.
            env={"a": {"HPWSN_FRAGMENT_SIZE": str(FRAGMENT_SIZE)}},
        )


@pytest.fixture
def subscribe():  # type: ignore[no-untyped-def]
    """Subscribe a consumer at a site; every subscription is ended after the test (before its
    consumer stops), so no later test waits on pushes to a consumer that is gone."""
    made: list[str] = []

    def sub(
        site: KillPlatform, consumer_url: str, topic: str, dialect: str = ns.DIALECT_COLON
    ) -> None:
        res = soap_call(site.endpoint, subscribe_xml(consumer_url, topic, dialect=dialect))
        assert res.status == 200, res.body
        made.append(res.findtext(".//wsnt:SubscriptionReference/wsa:Address") or "")

    yield sub
    for address in made:
        soap_call(address, "<wsnt:Unsubscribe/>", to=address)


def _peers(site: KillPlatform) -> dict[str, dict]:  # type: ignore[type-arg]
    raw = redis.Redis(port=site.redis_port).hgetall("hpwsn:fed:peers")
    return {k.decode(): json.loads(v) for k, v in raw.items()}


def _linked(
    sites: dict[str, KillPlatform],
    links: set[str] | dict[str, set[str]],
    *,
    own_paths: bool = False,
) -> bool:
    """Every site holds exactly these links at each of its peers (a set per site, or the same
    for all; `own_paths`: each stating the site's own name as its interest path, as for its own
    subscribers)."""
    for name, site in sites.items():
        peers = _peers(site)
        want = links[name] if isinstance(links, dict) else links
        for peer in SITES:
            if peer == name:
                continue
            rec = peers.get(peer, {})
            if set(rec.get("links", [])) != want or rec.get("last_error"):
                return False
            if own_paths and rec.get("paths") != dict.fromkeys(want, name):
                return False
    return True


def _quiet(sites: dict[str, KillPlatform]) -> bool:
    """No site has a notification waiting for its fan-out, nor anything queued for any
    subscription (links included): a notification a peer relayed a moment ago is in the first
    before it is in the second."""
    for site in sites.values():
        r = redis.Redis(port=site.redis_port)
        if r.llen("hpwsn:ingest") or r.exists("hpwsn:fanout:sched") or r.scard("hpwsn:busy"):
            return False
    return True


def _publish(site: KillPlatform, topic: str, text: str) -> None:
    res = soap_call(site.endpoint, notify_xml((topic, f"<n>{text}</n>")))
    assert res.status == 202, res.body


def publish_everywhere(
    sites: dict[str, KillPlatform],
    consumers: dict[str, RecordingConsumer],
    prefix: str,
    count: int,
    timeout: float,
) -> list[str]:
    """Publish `count` notifications on ALL1 at each site, in turns, and wait until every consumer
    has them all; returns their texts, sorted (`prefix-site-k`)."""
    for k in range(count):
        for name, site in sites.items():
            _publish(site, "ALL1", f"{prefix}-{name}-{k}")
    want = sorted(f"{prefix}-{name}-{k}" for name in sites for k in range(count))
    assert wait_until(
        lambda: all(set(c.payload_texts()) >= set(want) for c in consumers.values()),
        timeout=timeout,
        interval=0.5,
    ), {n: c.payload_texts() for n, c in consumers.items()}
    return want


def test_func02_and_func06_each_subscriber_gets_its_subtree_from_every_site_exactly_once(
    sites, consumer_factory, subscribe
):
    # 功能-02: one consumer per site, subscribed to ALL1, ALL2 and ALL3 there.
    everything = {name: consumer_factory() for name in SITES}
    for name, c in everything.items():
        for topic in ("ALL1", "ALL2", "ALL3"):
            subscribe(sites[name], c.url, topic)
    # 功能-06: ALL at a, ALL:ALARM at b, ALL:ALARM:ALARM1 at c.
    subtree = {"a": "ALL", "b": "ALL:ALARM", "c": "ALL:ALARM:ALARM1"}
    alarms = {name: consumer_factory() for name in SITES}
    for name, topic in subtree.items():
        subscribe(sites[name], alarms[name].url, topic)

    # Each site asks each peer for its own subscribers' topics only: the third site is a peer of
    # both and asks for its own itself (its links name it), so nothing is asked for on another
    # site's behalf, and a site gets pushed only what its own subscribers want.
    links = {name: {"ALL1", "ALL2", "ALL3", subtree[name]} for name in SITES}
    assert wait_until(lambda: _linked(sites, links, own_paths=True), timeout=60, interval=0.5), {
        name: _peers(s) for name, s in sites.items()
    }

    published = Counter()  # type: ignore[var-annotated]
    for name, topic in zip(SITES, ("ALL1", "ALL2", "ALL3"), strict=True):
        _publish(sites[name], topic, f"{name}:{topic}")
    alarm_topics = ("ALL", "ALL:ALARM", "ALL:ALARM:ALARM1", "ALL:ALARM:ALARM2")
    for name in SITES:
        for topic in alarm_topics:
            _publish(sites[name], topic, f"{name}:{topic}")
            published[topic] += 1

    want_everything = sorted(
        f"{n}:{t}" for n, t in zip(SITES, ("ALL1", "ALL2", "ALL3"), strict=True)
    )
    want_alarms = {
        name: sorted(
            f"{origin}:{topic}"
            for origin in SITES
            for topic in alarm_topics
            if topic == subtree[name] or topic.startswith(subtree[name] + ":")
        )
        for name in SITES
    }

    def arrived() -> bool:
        return all(
            set(everything[n].payload_texts()) >= set(want_everything)
            and set(alarms[n].payload_texts()) >= set(want_alarms[n])
            for n in SITES
        )

    assert wait_until(arrived, timeout=60, interval=0.5), {
        n: (everything[n].payload_texts(), alarms[n].payload_texts()) for n in SITES
    }
    # Once nothing is queued anywhere, nobody got anything twice or anything else.
    assert wait_until(lambda: _quiet(sites), timeout=60, interval=0.5)
    for n in SITES:
        assert sorted(everything[n].payload_texts()) == want_everything
        assert sorted(alarms[n].payload_texts()) == want_alarms[n]


def test_a_full_dialect_subscriber_gets_what_its_expression_matches_from_other_sites(
    sites, consumer_factory, subscribe
):
    c = sites["c"]
    consumer = consumer_factory()
    subscribe(c, consumer.url, "Object//Apple", dialect=ns.DIALECT_FULL)
    # c asks its peers for the subtree the pattern lies in, and matches what comes itself.
    assert wait_until(
        lambda: all("Object" in _peers(c).get(p, {}).get("links", []) for p in ("a", "b")),
        timeout=30,
    ), _peers(c)
    _publish(sites["a"], "Object:Food:Fruit:Pear", "a:pear")
    _publish(sites["a"], "Object:Food:Fruit:Apple", "a:apple")
    _publish(sites["b"], "Object:Tool", "b:tool")
    _publish(sites["b"], "Object:Food:Fruit:Apple", "b:apple")

    want = ["a:apple", "b:apple"]
    assert wait_until(
        lambda: set(consumer.payload_texts()) >= set(want), timeout=60, interval=0.5
    ), consumer.payload_texts()
    assert wait_until(lambda: _quiet(sites), timeout=60, interval=0.5)
    assert sorted(consumer.payload_texts()) == want


def counters(site: KillPlatform) -> dict[str, float]:
    """The site's counters from its /metrics: accepted per topic (`accepted:<topic>`) and
    notifications delivered per consumer host:port (`delivered:<host:port>`)."""
    text = httpx.get(f"http://127.0.0.1:{site.http_port}/metrics", timeout=5).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "hpwsn_topic_notifications_accepted_total":
                out[f"accepted:{sample.labels['topic']}"] = sample.value
            elif sample.name == "hpwsn_consumer_deliveries_total":
                out[f"delivered:{sample.labels['consumer']}"] = sample.value
    return out


def settled(sites: dict[str, KillPlatform]) -> dict[str, dict[str, float]]:
    """Every site's counters once nothing is queued anywhere, and still the same after a quiet
    period of several sync rounds: nothing is still going round."""
    assert wait_until(lambda: _quiet(sites), timeout=60, interval=0.5)
    first = {name: counters(s) for name, s in sites.items()}
    time.sleep(3)
    assert wait_until(lambda: _quiet(sites), timeout=60, interval=0.5)
    again = {name: counters(s) for name, s in sites.items()}
    assert again == first
    return again


def delta(after: dict[str, float], before: dict[str, float], key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


def host_port(site: KillPlatform) -> str:
    return f"127.0.0.1:{site.http_port}"


def test_in_a_ring_where_every_site_relays_each_subscriber_gets_each_notification_once(
    sites, consumer_factory, subscribe
):
    consumers = {name: consumer_factory() for name in SITES}
    for name, c in consumers.items():
        subscribe(sites[name], c.url, "ALL1")
    # Each site asks each peer for ALL1 for its own subscriber (and for nobody else: the third
    # site is a peer of both), so the count below starts once every link states its own path.
    assert wait_until(lambda: _linked(sites, {"ALL1"}, own_paths=True), timeout=60), {
        name: _peers(s) for name, s in sites.items()
    }
    before = settled(sites)

    count = 10
    want = publish_everywhere(sites, consumers, "ring", count, timeout=60)
    after = settled(sites)

    for name, c in consumers.items():
        # Once each, and each site's own in the order it was published.
        assert sorted(c.payload_texts()) == want
        for origin in SITES:
            mine = [t for t in c.payload_texts() if t.startswith(f"ring-{origin}-")]
            assert mine == [f"ring-{origin}-{k}" for k in range(count)]
        # Each site stored each notification once: its own, and each peer's from that peer.
        assert delta(after[name], before[name], "accepted:ALL1") == 3 * count
        for peer in SITES:
            if peer == name:
                continue
            # Pushed to a peer: its own only. The third site's reaches the peer by the third
            # site's own link (the peer's link here refuses it), and nothing goes back.
            pushed = delta(after[name], before[name], f"delivered:{host_port(sites[peer])}")
            assert pushed == count, (name, peer, pushed)


def _peer_up(site: KillPlatform, peer: str) -> int | None:
    text = httpx.get(f"http://127.0.0.1:{site.http_port}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith(f'hpwsn_federation_peer_up{{peer="{peer}"}}'):
            return int(float(line.rsplit(" ", 1)[1]))
    return None


def test_a_site_killed_and_restarted_mid_stream_gets_everything_in_order(
    sites, consumer_factory, subscribe
):
    a, c = sites["a"], sites["c"]
    consumer = consumer_factory()
    subscribe(c, consumer.url, "ALL2")
    assert wait_until(lambda: "ALL2" in _peers(c).get("a", {}).get("links", []), timeout=30)
    assert wait_until(lambda: _peer_up(a, "c") == 1, timeout=30)

    for k in range(10):
        _publish(a, "ALL2", f"stream-{k}")
    for name in ("web", "worker", "beat"):
        c.kill(name)
    for k in range(10, 20):
        _publish(a, "ALL2", f"stream-{k}")
    # The site registry at a sees c go down.
    assert wait_until(lambda: _peer_up(a, "c") == 0, timeout=30)
    for name in ("web", "worker", "beat"):
        c.start(name)
    want = [f"stream-{k}" for k in range(20)]
    assert wait_until(
        lambda: set(consumer.payload_texts()) >= set(want), timeout=120, interval=0.5
    ), consumer.payload_texts()
    assert list(dict.fromkeys(consumer.payload_texts())) == want
    assert wait_until(lambda: _peer_up(a, "c") == 1, timeout=30)


def test_func03_04_messages_of_many_fragment_sizes_cross_a_link_whole_and_once(
    sites, consumer_factory, subscribe
):
    a = sites["a"]
    receivers = {name: consumer_factory() for name in ("b", "c")}
    for name, c in receivers.items():
        subscribe(sites[name], c.url, "ALL3")
    assert wait_until(
        lambda: all("ALL3" in _peers(sites[n]).get("a", {}).get("links", []) for n in receivers),
        timeout=30,
    )
    # a pushes these to b and c as 2, 5, 10 and 100 fragments (its HPWSN_FRAGMENT_SIZE); each
    # receiving site reassembles, stores once, and delivers the whole message to its subscriber.
    texts = [f"big{times}:" + "x" * (FRAGMENT_SIZE * times) for times in (2, 5, 10, 100)]
    for text in texts:
        _publish(a, "ALL3", text)

    def arrived() -> bool:
        return all(set(c.payload_texts()) >= set(texts) for c in receivers.values())

    assert wait_until(arrived, timeout=120, interval=0.5), {
        n: [t[:12] for t in c.payload_texts()] for n, c in receivers.items()
    }
    assert wait_until(lambda: _quiet(sites), timeout=60, interval=0.5)
    for c in receivers.values():
        # Whole, once each: a reassembled message keeps its origin and is not forwarded again.
        assert sorted(c.payload_texts()) == sorted(texts)
