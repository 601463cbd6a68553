"""A small event log built by hand, and the figures the jobs must find in it, computed here in
plain Python (never by Spark)."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spark.eventlog import EventLog

# Monday 2 November 2026, 10:00 UTC: the run covers [T0, T0 + 3 h); the regressions job compares
# it with [T0 - 3 h, T0).
T0 = datetime(2026, 11, 2, 10, tzinfo=UTC).timestamp()
UNTIL = T0 + 3 * 3600
C1, C2, C3 = "127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003"
TOPICS = ("ALL:ALARM:A1", "ALL:ALARM:A2", "ALL:INFO")


def nid(i: int) -> str:
    return f"{i:032x}"


def events() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def add(kind: str, ts: float, **fields: Any) -> None:
        out.append({"type": kind, "ts": ts, **fields})

    add("subscription", T0 - 7200, sub="s1", action="created", consumer=C1, topic="ALL:ALARM")
    add("subscription", T0 - 7200, sub="s2", action="created", consumer=C2, topic="ALL")
    add("subscription", T0 - 7200, sub="s3", action="created", consumer=C3, topic="ALL:INFO")
    # The period before: C1 fast and healthy, C2 fine too.
    for i in range(20):
        ts = T0 - 3600 + i * 60
        add(
            "accepted",
            ts,
            nid=nid(1000 + i),
            topic="ALL:ALARM:A1",
            publisher="pub1",
            policy="fast",
            bytes=100,
        )
        add("delivered", ts + 1, nid=nid(1000 + i), sub="s1", consumer=C1, latency_ms=10.0 + i)
        add(
            "attempt",
            ts + 1,
            sub="s1",
            consumer=C1,
            batch=nid(1000 + i),
            messages=1,
            bytes=100,
            status=200,
            error="ok",
            duration_ms=3.0,
        )
        add(
            "attempt",
            ts + 1,
            sub="s2",
            consumer=C2,
            batch=nid(1000 + i),
            messages=1,
            bytes=100,
            status=200,
            error="ok",
            duration_ms=3.0,
        )
    # The period of the run.
    for i in range(60):
        topic = TOPICS[i % 3]
        ts = T0 + i * 150  # 2.5 min apart: over 2.5 hours
        size = 50 * (i + 1)
        add(
            "accepted",
            ts,
            nid=nid(i),
            topic=topic,
            publisher="pub1" if i % 4 else "",
            policy="fast",
            bytes=size,
        )
        if topic.startswith("ALL:ALARM"):
            add(
                "attempt",
                ts + 0.5,
                sub="s1",
                consumer=C1,
                batch=nid(i),
                messages=1,
                bytes=size,
                status=200,
                error="ok",
                duration_ms=2.0,
            )
            add("delivered", ts + 0.5, nid=nid(i), sub="s1", consumer=C1, latency_ms=100.0 + 7 * i)
        # C2 (everything): the first try of every 5th message fails with a 503, then succeeds.
        if i % 5 == 0:
            add(
                "attempt",
                ts + 0.2,
                sub="s2",
                consumer=C2,
                batch=nid(i),
                messages=1,
                bytes=size,
                status=503,
                error="http_5xx",
                duration_ms=5.0,
            )
            add(
                "attempt",
                ts + 2.2,
                sub="s2",
                consumer=C2,
                batch=nid(i),
                messages=1,
                bytes=size,
                status=200,
                error="ok",
                duration_ms=2.0,
            )
            add("delivered", ts + 2.2, nid=nid(i), sub="s2", consumer=C2, latency_ms=2200.0)
        else:
            add(
                "attempt",
                ts + 0.3,
                sub="s2",
                consumer=C2,
                batch=nid(i),
                messages=1,
                bytes=size,
                status=200,
                error="ok",
                duration_ms=2.0,
            )
            add("delivered", ts + 0.3, nid=nid(i), sub="s2", consumer=C2, latency_ms=300.0)
    # C3 is down: two timeouts, then a dead letter and a suspension.
    add(
        "attempt",
        T0 + 600,
        sub="s3",
        consumer=C3,
        batch=nid(2),
        messages=1,
        bytes=150,
        status=None,
        error="timeout",
        duration_ms=3000.0,
    )
    add(
        "attempt",
        T0 + 660,
        sub="s3",
        consumer=C3,
        batch=nid(2),
        messages=1,
        bytes=150,
        status=None,
        error="timeout",
        duration_ms=3000.0,
    )
    add("dead_lettered", T0 + 661, nid=nid(2), sub="s3", consumer=C3, reason="exhausted")
    add("subscription", T0 + 661, sub="s3", action="suspended")
    add("expired", T0 + 700, sub="s3", consumer=C3, topic="ALL:INFO", messages=4)
    # One message of ALL:INFO came in 3 fragments, another in 2.
    for off in range(3):
        add(
            "fragment",
            T0 + 30 + off,
            topic="ALL:INFO",
            ident="big-1",
            offset=off,
            more=off < 2,
            bytes=1000,
        )
    for off in range(2):
        add(
            "fragment",
            T0 + 40 + off,
            topic="ALL:INFO",
            ident="big-2",
            offset=off,
            more=off < 1,
            bytes=1000,
        )
    add("refused", T0 + 50, action="Notify", publisher="mallory", reason="TopicNotSupportedFault")
    # Outside the range: must not count.
    add(
        "accepted",
        UNTIL + 10,
        nid=nid(9999),
        topic="ALL:INFO",
        publisher="pub1",
        policy="fast",
        bytes=1,
    )
    return out  # fmt: skip


def write(root: Path) -> list[dict[str, Any]]:
    """Write the events through the real writer, each into the partition of its own hour."""
    evs = events()
    log = EventLog(root, compress_closed=True)
    for e in sorted(evs, key=lambda e: e["ts"]):
        fields = {k: v for k, v in e.items() if k not in ("type", "ts")}
        log.emit(e["type"], ts=e["ts"], **fields)
        log.flush(now=e["ts"])
    log.close()
    return evs


def in_run(evs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in evs if T0 <= e["ts"] < UNTIL]


def nearest_rank(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[max(0, math.ceil(p * len(s)) - 1)]
