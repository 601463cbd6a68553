"""Each job over a small hand-built event log equals the figures computed here in plain Python."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from datetime import UTC, datetime

import pytest

from spark.jobs import consumer_health, latency, regressions, sizes, top_n, traffic
from spark.jobs.common import PERCENTILE_ACCURACY, JobConfig, read_events
from tests.spark import handbuilt as hb
from tests.spark.handbuilt import C1, C2, C3, T0, UNTIL

CFG = JobConfig(since=T0, until=UNTIL, top_n=3)


@pytest.fixture(scope="module")
def log(tmp_path_factory, spark):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("events")
    evs = hb.write(root)
    assert list(root.glob("date=2026-11-02/hour=1[0-2]/*.jsonl.gz")), "hour files, compressed"
    df = read_events(spark, uri=root.as_uri(), since=CFG.previous_since, until=UNTIL).cache()
    return evs, df


def _hour(ts: float) -> str:
    return datetime.fromtimestamp(ts - ts % 3600, tz=UTC).strftime("%Y-%m-%d %H:00")


def _rows(df):  # type: ignore[no-untyped-def]
    return [r.asDict() for r in df.collect()]


def test_it_counts_traffic_per_topic_and_subtree_per_hour(log):  # type: ignore[no-untyped-def]
    evs, df = log
    run = hb.in_run(evs)
    topic_of = {e["nid"]: e["topic"] for e in evs if e["type"] == "accepted"}
    want: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for e in run:
        hour = _hour(e["ts"])
        if e["type"] == "accepted":
            want[(hour, e["topic"])]["published"] += 1
            want[(hour, e["topic"])]["bytes"] += e["bytes"]
        elif e["type"] == "delivered":
            want[(hour, topic_of[e["nid"]])]["delivered"] += 1
        elif e["type"] == "attempt" and e["error"] != "ok":
            want[(hour, topic_of[e["batch"]])]["failed"] += 1
        elif e["type"] == "expired":
            want[(hour, "ALL:INFO")]["expired"] += e["messages"]  # s3 subscribed to ALL:INFO

    rows = _rows(traffic.transform(df, cfg=CFG))
    got = {
        (r["bucket"].strftime("%Y-%m-%d %H:00"), r["topic"]): r
        for r in rows
        if r["grain"] == "hour" and r["scope"] == "topic"
    }
    assert set(got) == set(want)
    for key, counts in want.items():
        for field in ("published", "delivered", "failed", "expired", "bytes"):
            assert got[key][field] == counts[field], (key, field)
    # The subtree ALL:ALARM over the whole day: its two topics together.
    day = {r["topic"]: r for r in rows if r["grain"] == "day" and r["scope"] == "subtree"}
    alarm = [e for e in run if e["type"] == "accepted" and e["topic"].startswith("ALL:ALARM")]
    assert day["ALL:ALARM"]["published"] == len(alarm)
    assert day["ALL"]["published"] == sum(1 for e in run if e["type"] == "accepted")
    minutes = [r for r in rows if r["grain"] == "minute" and r["scope"] == "topic"]
    assert sum(r["published"] for r in minutes) == day["ALL"]["published"]


def test_it_finds_latency_percentiles_per_consumer_and_topic(log):  # type: ignore[no-untyped-def]
    evs, df = log
    run = hb.in_run(evs)
    topic_of = {e["nid"]: e["topic"] for e in evs if e["type"] == "accepted"}
    by: dict[tuple[str, str], list[float]] = defaultdict(list)
    for e in run:
        if e["type"] == "delivered":
            by[("consumer", e["consumer"])].append(e["latency_ms"])
            by[("topic", topic_of[e["nid"]])].append(e["latency_ms"])

    rows = _rows(latency.transform(df, cfg=CFG))
    overall = {(r["dimension"], r["key"]): r for r in rows if r["bucket"] is None}
    assert set(overall) == set(by)
    for key, values in by.items():
        r = overall[key]
        s = sorted(values)
        assert r["count"] == len(values)
        assert r["max_ms"] == max(values)
        for p, col in ((0.5, "p50_ms"), (0.95, "p95_ms"), (0.99, "p99_ms")):
            # percentile_approx: the value's rank is within n / accuracy of the exact rank.
            exact = math.ceil(p * len(s))
            err = max(1, math.ceil(len(s) / PERCENTILE_ACCURACY))
            ranks = [i + 1 for i, v in enumerate(s) if v == r[col]]
            assert ranks, (key, col)
            assert min(abs(rank - exact) for rank in ranks) <= err, (key, col)
            assert r[col] == hb.nearest_rank(values, p)  # this small, it is exact
    hourly = [r for r in rows if r["bucket"] is not None and r["key"] == C1]
    assert sum(r["count"] for r in hourly) == len(by[("consumer", C1)])


def test_it_measures_consumer_health(log):  # type: ignore[no-untyped-def]
    evs, df = log
    run = hb.in_run(evs)
    rows = {r["consumer"]: r for r in _rows(consumer_health.transform(df, cfg=CFG))}
    for consumer in (C1, C2, C3):
        attempts = [e for e in run if e["type"] == "attempt" and e["consumer"] == consumer]
        fails = [e for e in attempts if e["error"] != "ok"]
        delivered = [e for e in run if e["type"] == "delivered" and e["consumer"] == consumer]
        r = rows[consumer]
        assert r["attempts"] == len(attempts)
        assert r["failures"] == len(fails)
        assert r["failure_rate"] == pytest.approx(len(fails) / len(attempts))
        assert r["delivered"] == len(delivered)
        assert r["http_5xx"] == sum(1 for e in fails if e["error"] == "http_5xx")
        assert r["timeout"] == sum(1 for e in fails if e["error"] == "timeout")
    # C2: every 5th message took a second try, 2 s after the first failed.
    retried = sum(1 for i in range(60) if i % 5 == 0)
    assert rows[C2]["retries_per_delivered"] == pytest.approx(retried / 60)
    assert rows[C2]["recoveries"] == retried
    assert rows[C2]["mttr_s"] == pytest.approx(2.0)
    assert rows[C1]["failures"] == 0
    assert rows[C1]["mttr_s"] is None
    assert rows[C3]["dead_letters"] == 1
    assert rows[C3]["suspensions"] == 1
    assert rows[C3]["delivered"] == 0


def test_it_ranks_the_top_topics_publishers_and_consumers(log):  # type: ignore[no-untyped-def]
    evs, df = log
    run = hb.in_run(evs)
    rows = _rows(top_n.transform(df, cfg=CFG))
    table: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for r in sorted(rows, key=lambda r: (r["ranking"], r["rank"])):
        table[r["ranking"]].append((r["key"], r["value"]))

    def top(counter: Counter[str]) -> list[tuple[str, float]]:
        ordered = sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))
        return [(k, float(v)) for k, v in ordered[: CFG.top_n] if v > 0]

    accepted = [e for e in run if e["type"] == "accepted"]
    topic_of = {e["nid"]: e["topic"] for e in accepted}
    delivered = [e for e in run if e["type"] == "delivered"]
    fails = [e for e in run if e["type"] == "attempt" and e["error"] != "ok"]
    assert table["topics_by_volume"] == top(Counter(e["topic"] for e in accepted))
    assert table["publishers_by_volume"] == top(
        Counter(e["publisher"] or "(anonymous)" for e in accepted)
    )
    assert table["consumers_by_volume"] == top(Counter(e["consumer"] for e in delivered))
    assert table["consumers_by_failures"] == top(Counter(e["consumer"] for e in fails))
    assert table["topics_by_failures"] == top(Counter(topic_of[e["batch"]] for e in fails))
    assert table["publishers_by_refusals"] == [("mallory", 1.0)]
    per_topic = Counter(topic_of[e["nid"]] for e in delivered)
    published = Counter(e["topic"] for e in accepted)
    fanout = Counter({t: per_topic[t] / n for t, n in published.items()})
    want = top(fanout)
    assert [k for k, _v in table["topics_by_fanout"]] == [k for k, _v in want]
    assert [v for _k, v in table["topics_by_fanout"]] == pytest.approx([v for _k, v in want])


def test_it_draws_sizes_fragments_and_the_weekly_heatmap(log):  # type: ignore[no-untyped-def]
    evs, df = log
    run = hb.in_run(evs)
    rows = _rows(sizes.transform(df, cfg=CFG))
    accepted = [e for e in run if e["type"] == "accepted"]
    want_sizes = Counter(2 ** int(math.log2(e["bytes"])) for e in accepted)
    assert {r["x"]: r["count"] for r in rows if r["kind"] == "size"} == want_sizes
    assert {r["x"]: r["count"] for r in rows if r["kind"] == "fragments"} == {3: 1, 2: 1}
    heat = Counter(
        (
            datetime.fromtimestamp(e["ts"], tz=UTC).isoweekday(),
            datetime.fromtimestamp(e["ts"], tz=UTC).hour,
        )
        for e in accepted
    )
    assert {(r["x"], r["y"]): r["count"] for r in rows if r["kind"] == "heatmap"} == heat
    assert all(x == 1 for x, _h in heat)  # a Monday


def test_it_names_the_consumers_that_regressed(log):  # type: ignore[no-untyped-def]
    evs, df = log
    rows = _rows(regressions.transform(df, cfg=CFG))
    before = [
        e["latency_ms"]
        for e in evs
        if e["type"] == "delivered" and e["consumer"] == C1 and e["ts"] < T0
    ]
    now = [
        e["latency_ms"] for e in hb.in_run(evs) if e["type"] == "delivered" and e["consumer"] == C1
    ]
    by = {r["consumer"]: r for r in rows}
    assert by[C1]["p99_before"] == hb.nearest_rank(before, 0.99)
    assert by[C1]["p99_now"] == hb.nearest_rank(now, 0.99)
    assert by[C2]["failure_rate_before"] == 0
    assert by[C2]["failure_rate_now"] == pytest.approx(12 / 72)
    assert rows[0]["consumer"] == C1  # p99 from 29 ms to ~500 ms: the largest rise
    assert C3 not in by  # no figures before: nothing to compare


def test_it_reads_nothing_from_an_empty_log(spark, tmp_path):  # type: ignore[no-untyped-def]
    df = read_events(spark, uri=tmp_path.as_uri(), since=T0, until=UNTIL)
    assert traffic.transform(df, cfg=CFG).count() == 0
    assert consumer_health.transform(df, cfg=CFG).count() == 0
