"""The counters API against a real Redis: batching, per-second buckets, totals, the off switch."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import redis
from django.conf import settings

from monitoring import counters
from monitoring.selectors import MINUTE
from monitoring.stats import LAT_COUNT, latency_bucket


@pytest.fixture
def r():  # type: ignore[no-untyped-def]
    counters.configure(enabled=True, redis_url=settings.REDIS_URL)
    client = redis.Redis.from_url(settings.REDIS_URL)
    yield client
    counters.configure(enabled=bool(settings.HPWSN_MONITORING))
    client.close()


def _field(r, key: str, field: str) -> int:  # type: ignore[no-untyped-def]
    return int(r.hget(key, field) or 0)


def test_it_flushes_batched_counts_into_the_second_and_the_totals(r):
    topic, consumer = "unit:counters:topic", "http://counters.invalid:7001/c?x=1"
    total_before = _field(r, counters.TOTAL, f"t:accepted:{topic}")
    sec = int(time.time())
    for _ in range(5):
        counters.incr("accepted", topic=topic)
    counters.incr("failed", 2, consumer=consumer)
    counters.observe_latency(0.012)
    counters.observe_latency(0.012)
    counters.flush()
    keys = [counters.second_key(s) for s in (sec, sec + 1)]  # the second may have turned
    assert sum(_field(r, k, f"t:accepted:{topic}") for k in keys) == 5
    assert sum(_field(r, k, "c:failed:counters.invalid:7001") for k in keys) == 2
    assert sum(_field(r, k, f"l:{latency_bucket(12.0)}") for k in keys) >= 2
    assert _field(r, counters.TOTAL, f"t:accepted:{topic}") == total_before + 5
    ttl = r.ttl(keys[0]) if r.exists(keys[0]) else r.ttl(keys[1])
    assert 0 < ttl <= counters.SECOND_TTL_S


def test_a_second_is_kept_for_the_minute_the_snapshot_reads_and_not_much_longer(r):
    # The snapshot reads the last 60 s; the 15-minute charts are its points, kept apart. A second
    # kept 20 minutes (as before) held ~1 MB of Redis at 1,000 notifications/s for no reader, and
    # made Redis's memory grow for 20 minutes after a start.
    counters.incr("accepted", topic="unit:counters:ttl")
    sec = int(time.time())
    counters.flush()
    ttl = max(r.ttl(counters.second_key(s)) for s in (sec, sec + 1))
    assert MINUTE < ttl <= 300


def test_the_flusher_thread_writes_within_a_fraction_of_a_second(r):
    topic = "unit:counters:thread"
    before = _field(r, counters.TOTAL, f"t:accepted:{topic}")
    counters.incr("accepted", 3, topic=topic)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        if _field(r, counters.TOTAL, f"t:accepted:{topic}") == before + 3:
            break
        time.sleep(0.05)
    assert _field(r, counters.TOTAL, f"t:accepted:{topic}") == before + 3


def test_switched_off_every_call_is_a_no_op(r):
    counters.flush()
    counters.configure(enabled=False)
    before = _field(r, counters.TOTAL, LAT_COUNT)
    counters.incr("accepted", topic="unit:counters:off")
    counters.observe_latency(0.5)
    assert counters.flush() == 0
    assert _field(r, counters.TOTAL, "t:accepted:unit:counters:off") == 0
    assert _field(r, counters.TOTAL, LAT_COUNT) == before


def test_counts_survive_a_failed_flush_and_go_out_with_the_next(r):
    topic = "unit:counters:retry"
    before = _field(r, counters.TOTAL, f"t:accepted:{topic}")
    counters.flush()
    counters.configure(redis_url="redis://127.0.0.1:1/0")  # nothing listens there
    counters.incr("accepted", 4, topic=topic)
    assert counters.flush() == 0
    assert _field(r, counters.TOTAL, f"t:accepted:{topic}") == before
    counters.configure(redis_url=settings.REDIS_URL)
    deadline = time.monotonic() + 2.0
    while _field(r, counters.TOTAL, f"t:accepted:{topic}") != before + 4:
        assert time.monotonic() < deadline, "the kept counts were never written"
        counters.flush()
        time.sleep(0.05)


def test_a_process_exits_with_its_flusher_stopped_and_its_last_counts_written(r):
    # The flusher is stopped before the last flush: a daemon thread left running at shutdown
    # may be frozen holding the Redis pool's lock, and the client's finalizer then waits for it.
    topic = "unit:counters:exit"
    before = _field(r, counters.TOTAL, f"t:accepted:{topic}")
    script = f"""
import atexit, threading
def report():  # registered first: runs after the counters' own exit handler
    alive = any(t.name == "hpwsn-counters" and t.is_alive() for t in threading.enumerate())
    print("alive" if alive else "stopped")
atexit.register(report)
from monitoring import counters
counters.configure(enabled=True, redis_url={settings.REDIS_URL!r})
counters.incr("accepted", 3, topic={topic!r})
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=True
    )
    assert done.stdout.split() == ["stopped"], done.stderr
    assert _field(r, counters.TOTAL, f"t:accepted:{topic}") == before + 3


def test_the_totals_keep_a_bounded_number_of_labels_and_every_count(r, settings, db, monkeypatch):
    """A subscriber can name a new consumer host:port at every Subscribe: past the bound, each
    counter keeps its largest labels and adds the rest into its "(other)" label."""
    from monitoring import services

    # Only this test's fields in the totals it bounds: what earlier tests counted in this process
    # is written out first, and a key of its own keeps out what a platform of other tests adds.
    counters.flush()
    monkeypatch.setattr(counters, "TOTAL", counters.TOTAL + ":bound-test")
    r.delete(counters.TOTAL)
    for i in range(1, 61):
        r.hset(counters.TOTAL, f"c:failed:127.0.{i}.1:80", i)
    for i in range(1, 11):
        r.hset(counters.TOTAL, f"t:accepted:Bound:T{i}", 100 + i)
    r.hset(counters.TOTAL, "accepted", 1_055)
    settings.HPWSN_MONITORING_MAX_LABELS = 30

    services.snapshot_publish(now=time.time() + 3600)  # a second not published yet

    total = {k.decode(): int(v) for k, v in r.hgetall(counters.TOTAL).items()}
    consumers = {k: v for k, v in total.items() if k.startswith("c:failed:")}
    topics = {k: v for k, v in total.items() if k.startswith("t:accepted:")}
    assert len(total) <= 30
    # Each of the two counters keeps its share (12) of four fifths of the bound, the largest.
    assert sorted(consumers) == sorted(
        [f"c:failed:127.0.{i}.1:80" for i in range(49, 61)] + ["c:failed:(other)"]
    )
    assert consumers["c:failed:(other)"] == sum(range(1, 49))
    assert sum(consumers.values()) == sum(range(1, 61))
    assert len(topics) == 10  # under its share: as it was
    assert total["accepted"] == 1_055
    assert services.labels_bound(limit=30) == 0  # within the bound now
    r.delete(counters.TOTAL)
