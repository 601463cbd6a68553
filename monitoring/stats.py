"""Pure arithmetic of the live statistics: buckets, rates, percentiles, top-N, node state.

No Django, no Redis: the counters, the snapshot and /metrics all share these rules, and they
are unit-tested in milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

NAMES = (
    "accepted",
    "delivered",
    "failed",
    "retried",
    "dead",
    "expired",
    "filter_errors",
    "filter_skipped",
)

# Latency is kept as a histogram with logarithmic buckets rather than as samples: histograms
# of every process and every second merge by addition, cost a fixed number of fields, and give
# percentiles within half a bucket (2^(1/16) - 1 = 4.4 % relative error at most).
LAT_MIN_MS = 0.1
LAT_STEPS_PER_DOUBLING = 8
LOG_STEP = math.log(2.0) / LAT_STEPS_PER_DOUBLING
LAT_MAX_BUCKET = 240  # 0.1 ms * 2^30: about 30 hours; longer waits land in the last bucket

# Field names inside a per-second (or the total) hash.
LAT_FIELD = "l:"  # l:<bucket> -> count
LAT_COUNT = "lat_count"
LAT_SUM_US = "lat_sum_us"
TOPIC_FIELD = "t:"  # t:<counter name>:<topic path> -> count
CONSUMER_FIELD = "c:"  # c:<counter name>:<consumer host:port> -> count

ALIVE, LATE, DEAD, STOPPED = "alive", "late", "dead", "stopped"


def latency_bucket(ms: float) -> int:
    """The histogram bucket of a latency in milliseconds (bucket i starts at 0.1 ms * 2^(i/8))."""
    if ms <= LAT_MIN_MS:
        return 0
    return min(LAT_MAX_BUCKET, int(math.log(ms / LAT_MIN_MS) / LOG_STEP))


def bucket_value(bucket: int) -> float:
    """The value a bucket stands for: the geometric middle of its bounds, in milliseconds."""
    return LAT_MIN_MS * math.exp((bucket + 0.5) * LOG_STEP)


def percentile(histogram: Mapping[int, int], q: float) -> float | None:
    """Nearest-rank percentile `q` (0-100) of a bucket histogram, in milliseconds."""
    total = sum(histogram.values())
    if total <= 0:
        return None
    rank = max(1, math.ceil(q / 100.0 * total))
    seen = 0
    for bucket in sorted(histogram):
        seen += histogram[bucket]
        if seen >= rank:
            return bucket_value(bucket)
    return bucket_value(max(histogram))


@dataclass(slots=True)
class Window:
    """Counts of a span of seconds, split the way the hashes store them."""

    counts: dict[str, int] = field(default_factory=dict)
    topics: dict[str, dict[str, int]] = field(default_factory=dict)  # name -> topic -> n
    consumers: dict[str, dict[str, int]] = field(default_factory=dict)  # name -> consumer -> n
    latency: dict[int, int] = field(default_factory=dict)
    latency_count: int = 0
    latency_sum_us: int = 0

    def add(self, raw: Mapping[bytes | str, bytes | str | int]) -> Window:
        """Add one hash (HGETALL reply) to the window."""
        for key, value in raw.items():
            name = key.decode() if isinstance(key, bytes) else key
            n = int(value)
            if name.startswith(LAT_FIELD):
                b = int(name[len(LAT_FIELD) :])
                self.latency[b] = self.latency.get(b, 0) + n
            elif name.startswith(TOPIC_FIELD) or name.startswith(CONSUMER_FIELD):
                kind, counter, label = name.split(":", 2)
                table = self.topics if kind == "t" else self.consumers
                per = table.setdefault(counter, {})
                per[label] = per.get(label, 0) + n
            elif name == LAT_COUNT:
                self.latency_count += n
            elif name == LAT_SUM_US:
                self.latency_sum_us += n
            else:
                self.counts[name] = self.counts.get(name, 0) + n
        return self

    def count(self, name: str) -> int:
        return self.counts.get(name, 0)

    def quantiles(self, qs: Iterable[float] = (50, 95, 99)) -> dict[str, float | None]:
        return {f"p{q:g}": _round(percentile(self.latency, q)) for q in qs}


def window(hashes: Iterable[Mapping[bytes | str, bytes | str | int]]) -> Window:
    w = Window()
    for h in hashes:
        w.add(h)
    return w


def _round(v: float | None, digits: int = 2) -> float | None:
    return None if v is None else round(v, digits)


def top_n(
    rows: Mapping[str, Mapping[str, int]], *, key: tuple[str, ...], n: int
) -> list[tuple[str, dict[str, int]]]:
    """The `n` labels with the largest values of `key` (compared in order), ties by label."""
    ranked = sorted(rows.items(), key=lambda kv: (*(-kv[1].get(k, 0) for k in key), kv[0]))
    return [(label, dict(values)) for label, values in ranked[:n]]


def pivot(*tables: tuple[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """Turn {column: {label: n}} tables into {label: {column: n}} rows."""
    rows: dict[str, dict[str, int]] = {}
    for column, table in tables:
        for label, n in table.items():
            rows.setdefault(label, {})[column] = n
    return rows


def node_state(*, age: float, interval: float, dead_after: float, stopped: bool = False) -> str:
    """alive: heard within about one heartbeat; late: missed one or two; dead: silent too long."""
    if stopped:
        return STOPPED
    if age >= dead_after:
        return DEAD
    # Half an interval of slack: a heartbeat is written at the end of its period.
    if age <= interval * 1.5:
        return ALIVE
    return LATE


def last_complete_second(now: float, *, flush_s: float) -> int:
    """The latest second whose counts every process has flushed (flushes lag by ~flush_s)."""
    return int(now - flush_s * 1.5) - 1
