"""The pure rules behind the live statistics: buckets, percentiles, windows, top-N, node state."""

from __future__ import annotations

import random
import time

import pytest

from dispatch.ids import notification_id_new, notification_id_time
from monitoring.counters import consumer_label
from monitoring.stats import (
    ALIVE,
    DEAD,
    LATE,
    STOPPED,
    Window,
    bucket_value,
    last_complete_second,
    latency_bucket,
    node_state,
    percentile,
    pivot,
    top_n,
    window,
)


def test_it_places_a_latency_in_a_bucket_within_five_percent():
    for ms in (0.15, 1.0, 3.3, 12.0, 250.0, 9_999.0, 3_600_000.0):
        assert bucket_value(latency_bucket(ms)) == pytest.approx(ms, rel=0.05)


def test_it_puts_tiny_negative_and_huge_latencies_in_the_edge_buckets():
    assert latency_bucket(-5.0) == 0
    assert latency_bucket(0.0) == 0
    assert latency_bucket(1e15) == latency_bucket(1e16)


def test_percentiles_of_the_histogram_match_the_exact_ones_within_a_bucket():
    rng = random.Random(7)
    values = sorted(rng.lognormvariate(2.0, 1.0) for _ in range(20_000))
    hist: dict[int, int] = {}
    for v in values:
        b = latency_bucket(v)
        hist[b] = hist.get(b, 0) + 1
    for q in (50, 95, 99):
        exact = values[int(q / 100 * len(values)) - 1]
        assert percentile(hist, q) == pytest.approx(exact, rel=0.06)


def test_percentile_of_nothing_is_none_and_of_one_value_is_that_value():
    assert percentile({}, 99) is None
    assert percentile({latency_bucket(8.0): 1}, 50) == pytest.approx(8.0, rel=0.05)


def test_a_window_adds_hashes_of_many_seconds_and_processes():
    second_a = {
        b"accepted": b"3",
        b"t:accepted:ALL:ALARM": b"2",
        b"t:accepted:ALL": b"1",
        b"c:failed:127.0.0.1:9000": b"1",
        b"l:10": b"2",
        b"lat_count": b"2",
        b"lat_sum_us": b"500",
    }
    second_b = {"accepted": "4", "t:accepted:ALL:ALARM": "4", "l:10": "1", "l:30": "1"}
    w = window([second_a, second_b, {}])
    assert w.count("accepted") == 7
    assert w.count("delivered") == 0
    assert w.topics == {"accepted": {"ALL:ALARM": 6, "ALL": 1}}
    assert w.consumers == {"failed": {"127.0.0.1:9000": 1}}
    assert w.latency == {10: 3, 30: 1}
    assert (w.latency_count, w.latency_sum_us) == (2, 500)
    assert w.quantiles()["p50"] == pytest.approx(bucket_value(10), abs=0.01)
    assert Window().quantiles() == {"p50": None, "p95": None, "p99": None}


def test_top_n_ranks_by_keys_in_order_then_by_label():
    rows = pivot(
        ("failed", {"a:1": 5, "b:1": 5, "c:1": 1, "d:1": 0}),
        ("delivered", {"a:1": 1, "b:1": 9, "e:1": 100}),
    )
    ranked = top_n(rows, key=("failed", "delivered"), n=3)
    assert [label for label, _ in ranked] == ["b:1", "a:1", "c:1"]
    assert ranked[0][1] == {"failed": 5, "delivered": 9}
    assert len(top_n(rows, key=("failed",), n=100)) == 5


@pytest.mark.parametrize(
    ("age", "stopped", "expected"),
    [(0.0, False, ALIVE), (2.9, False, ALIVE), (3.1, False, LATE), (9.9, False, LATE),
     (10.0, False, DEAD), (3600.0, False, DEAD), (50.0, True, STOPPED)],
)  # fmt: skip
def test_node_state_follows_missed_heartbeats(age, stopped, expected):
    assert node_state(age=age, interval=2.0, dead_after=10.0, stopped=stopped) == expected


def test_rates_use_only_seconds_every_process_has_flushed():
    # Counts of second s are flushed by s + 1 + flush interval: not before.
    assert last_complete_second(100.5, flush_s=0.2) == 99
    assert last_complete_second(100.2, flush_s=0.2) == 98


def test_consumer_labels_are_hosts_never_paths_or_queries():
    assert consumer_label("http://10.0.0.5:9000/consumer?id=42") == "10.0.0.5:9000"
    assert consumer_label("https://example.com/a/b") == "example.com"
    assert consumer_label("http://[::1]:8080/x") == "[::1]:8080"
    assert consumer_label("not a url") == "invalid"


def test_a_notification_id_carries_its_accept_time():
    now = time.time()
    nid = notification_id_new(now)
    assert len(nid) == 32
    assert int(nid, 16) >= 0
    assert notification_id_time(nid) == pytest.approx(now, abs=0.001)
    assert notification_id_time(nid.encode()) == pytest.approx(now, abs=0.001)
    assert notification_id_new(now) != nid


def test_ids_of_the_old_format_or_garbage_carry_no_time():
    assert notification_id_time("f" * 32) is None  # far future
    assert notification_id_time("0" * 32) is None  # before 2020
    assert notification_id_time("zz" * 16) is None
    assert notification_id_time("abc") is None
