"""Prometheus exposition: a collector that reads the shared aggregates in Redis at scrape time.

Every process counts into Redis, so any web process can answer a scrape with the figures of the
whole cluster. Labels are bounded: the top-N topic paths and consumer hosts by total, node
host/pid/role of registered nodes; never message ids, and never a subscription's or pull point's
id (it is in the address that acts on it): the deepest queues are labelled by a tag
(subscriptions.selectors.resource_tag) and consumer host.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector, CollectorRegistry

from federation.selectors import peers_status
from monitoring.selectors import metrics_data
from monitoring.stats import ALIVE, DEAD, LATE, STOPPED

_COUNTERS = (
    ("accepted", "hpwsn_notifications_accepted", "Notifications accepted from publishers."),
    ("delivered", "hpwsn_deliveries", "Notifications delivered to push consumers."),
    ("failed", "hpwsn_delivery_failures", "Failed delivery attempts (one per failed Notify POST)."),
    ("retried", "hpwsn_delivery_retries", "Retries scheduled after transient failures."),
    ("dead", "hpwsn_dead_letters", "Notifications moved to dead letters (permanent failures)."),
    (
        "expired",
        "hpwsn_notifications_expired",
        "Notifications whose time to live ran out before push.",
    ),
    (
        "filter_errors",
        "hpwsn_filter_errors",
        "MessageContent filter evaluations that failed (counted as no match).",
    ),
    (
        "filter_skipped",
        "hpwsn_filter_skipped",
        "Filter evaluations not run: the message exceeded HPWSN_FILTER_MAX_PAYLOAD_BYTES.",
    ),
)


class HpwsnCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        data = metrics_data(now=time.time(), top=settings.HPWSN_METRICS_TOP_N)
        yield from _counters(data)
        yield from _gauges(data)
        yield from _nodes(data["nodes"])
        if settings.HPWSN_FEDERATION_PEERS:
            yield from _peers(peers_status(now=time.time()))


def _counters(data: dict[str, Any]) -> Iterator[Metric]:
    for name, metric, doc in _COUNTERS:
        yield CounterMetricFamily(metric, doc, value=data["totals"][name])
    topics = CounterMetricFamily(
        "hpwsn_topic_notifications_accepted",
        "Notifications accepted per topic (the top topics by total).",
        labels=["topic"],
    )
    for topic, row in data["topics"]:
        topics.add_metric([topic], row.get("accepted", 0))
    yield topics
    for name, metric, doc in (
        (
            "delivered",
            "hpwsn_consumer_deliveries",
            "Notifications delivered per consumer host (top consumers).",
        ),
        (
            "failed",
            "hpwsn_consumer_delivery_failures",
            "Failed attempts per consumer host (top consumers).",
        ),
        (
            "dead",
            "hpwsn_consumer_dead_letters",
            "Dead-lettered notifications per consumer (top consumers).",
        ),
    ):
        family = CounterMetricFamily(metric, doc, labels=["consumer"])
        for consumer, row in data["consumers"]:
            family.add_metric([consumer], row.get(name, 0))
        yield family
    lat = data["latency"]
    summary = SummaryMetricFamily(
        "hpwsn_delivery_latency_seconds",
        "Publish-to-delivery latency; quantiles over the last minute, count and sum since start.",
        labels=[],
    )
    summary.add_metric([], count_value=lat["count"], sum_value=lat["sum_s"])
    yield summary
    quantiles = GaugeMetricFamily(
        "hpwsn_delivery_latency_quantile_seconds",
        "Publish-to-delivery latency quantiles over the last minute.",
        labels=["quantile"],
    )
    for q, key in (("0.5", "p50"), ("0.95", "p95"), ("0.99", "p99")):
        ms = lat["quantiles"].get(key)
        if ms is not None:
            quantiles.add_metric([q], ms / 1000.0)
    yield quantiles


def _gauges(data: dict[str, Any]) -> Iterator[Metric]:
    q = data["queues"]
    yield GaugeMetricFamily(
        "hpwsn_retries_waiting", "Subscriptions waiting for a retry.", value=q["retries_waiting"]
    )
    queues = GaugeMetricFamily(
        "hpwsn_queue_length", "Messages waiting in broker queues.", labels=["queue"]
    )
    queues.add_metric(["celery"], q["celery"])
    queues.add_metric(["ingest"], q["ingest"])
    queues.add_metric(["subscriptions"], q["subscription_messages"])
    queues.add_metric(["pullpoints"], q["pullpoint_messages"])
    yield queues
    deepest = GaugeMetricFamily(
        "hpwsn_subscription_queue_length",
        "Messages queued for the deepest subscription queues (subscription: a short tag).",
        labels=["subscription", "consumer"],
    )
    for row in q["deepest"]:
        deepest.add_metric([row["subscription"], row["consumer"]], row["depth"])
    yield deepest
    yield GaugeMetricFamily(
        "hpwsn_dead_letters_waiting", "Dead letters kept for redrive.", value=q["dead_letters"]
    )
    yield GaugeMetricFamily("hpwsn_subscriptions", "Push subscriptions.", value=q["subscriptions"])
    failing = CounterMetricFamily(
        "hpwsn_subscription_filter_errors",
        "Failed evaluations of a subscription's content filter (subscriptions with most).",
        labels=["subscription"],
    )
    for sub_id, n in data["filter_errors"]:
        failing.add_metric([sub_id], n)
    yield failing
    yield GaugeMetricFamily("hpwsn_pullpoints", "Pull points.", value=q["pullpoint_count"])


def _nodes(nodes: list[dict[str, Any]]) -> Iterator[Metric]:
    by_state = GaugeMetricFamily(
        "hpwsn_nodes", "Registered processes by role and state.", labels=["role", "state"]
    )
    counts: dict[tuple[str, str], int] = {}
    for role in ("web", "worker", "beat"):
        for st in (ALIVE, LATE, DEAD, STOPPED):
            counts[(role, st)] = 0
    for node in nodes:
        key = (str(node.get("role")), str(node["state"]))
        counts[key] = counts.get(key, 0) + 1
    for (role, st), n in sorted(counts.items()):
        by_state.add_metric([role, st], n)
    yield by_state
    labels = ["role", "host", "pid"]
    figures = {
        "cpu": GaugeMetricFamily(
            "hpwsn_node_cpu_percent", "CPU of the node's processes (100 = one core).", labels=labels
        ),
        "rss": GaugeMetricFamily(
            "hpwsn_node_resident_memory_bytes", "Resident memory of the node.", labels=labels
        ),
        "threads": GaugeMetricFamily("hpwsn_node_threads", "Threads of the node.", labels=labels),
        "fds": GaugeMetricFamily(
            "hpwsn_node_open_fds", "Open file descriptors of the node.", labels=labels
        ),
    }
    up = GaugeMetricFamily("hpwsn_node_up", "1 while the node heartbeats.", labels=labels)
    for node in nodes:
        values = [str(node.get("role")), str(node.get("host")), str(node.get("pid"))]
        up.add_metric(values, 1 if node["state"] == ALIVE else 0)
        if node["state"] in (ALIVE, LATE):
            for key, family in figures.items():
                family.add_metric(values, float(node.get(key) or 0))
    yield up
    yield from figures.values()


registry = CollectorRegistry(auto_describe=False)
registry.register(HpwsnCollector())


def _peers(peers: list[dict[str, Any]]) -> Iterator[Metric]:
    """The site registry: each federated peer, up while its sync rounds reach it."""
    up = GaugeMetricFamily(
        "hpwsn_federation_peer_up", "1 while the peer answers this site's sync.", labels=["peer"]
    )
    age = GaugeMetricFamily(
        "hpwsn_federation_peer_last_seen_seconds",
        "Seconds since the peer last answered (absent before it ever did).",
        labels=["peer"],
    )
    links = GaugeMetricFamily(
        "hpwsn_federation_links", "Topic subtrees this site is subscribed to at the peer.",
        labels=["peer"],
    )  # fmt: skip
    for p in peers:
        up.add_metric([p["name"]], 1 if p["state"] == "up" else 0)
        if p["last_ok_age_s"] is not None:
            age.add_metric([p["name"]], p["last_ok_age_s"])
        links.add_metric([p["name"]], len(p["links"]))
    yield up
    yield age
    yield links
