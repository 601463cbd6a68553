"""A realistic synthetic event log for demos and benchmarks (no Django, no Spark).

Diurnal load (quiet nights, a busy afternoon, lighter weekends), Zipf-distributed topics and
publishers over a two-level topic tree, about two subscriptions per region, a few failing
consumers (retries, dead letters, a suspension), slow ones, one that gets slower over the range
(the regressions job finds it), and some large messages that arrived as fragments. The lines
follow spark/eventlog.py exactly; files are gzipped hour partitions like the live writer's.
"""

from __future__ import annotations

import gzip
import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from spark.eventlog import SCHEMA_VERSION, partition_dir

REGIONS = 8
SENSORS = 25
CONSUMERS = 20
PUBLISHERS = 30
FRAGMENT_SIZE = 65536
NODE = "synth:0"


@dataclass(frozen=True, slots=True)
class Consumer:
    label: str
    sub: str
    region: int
    fail_p: float  # chance an attempt fails
    latency_ms: float  # median publish -> delivery
    slowing: bool = False  # latency grows over the range


def _consumers(rng: random.Random) -> list[Consumer]:
    out = []
    for i in range(CONSUMERS):
        fail_p = 0.35 if i in (3, 11) else (0.05 if i == 7 else 0.002)
        latency = 900.0 if i in (5, 13) else 15.0 + rng.random() * 30
        out.append(
            Consumer(
                label=f"10.0.{i // 10}.{i % 10 + 10}:8080",
                sub=f"{rng.getrandbits(128):032x}",
                region=i % REGIONS,
                fail_p=fail_p,
                latency_ms=latency,
                slowing=i == 9,
            )
        )
    return out


def _zipf_cum(n: int, s: float) -> list[float]:
    acc, out = 0.0, []
    for k in range(1, n + 1):
        acc += 1.0 / k**s
        out.append(acc)
    return out


def _load(t: datetime) -> float:
    """Relative load at an hour: a daily wave peaking at 15:00 UTC, weekends at 40 %."""
    daily = 0.25 + 0.75 * (0.5 - 0.5 * math.cos((t.hour - 3) / 24 * 2 * math.pi))
    return daily * (0.4 if t.isoweekday() >= 6 else 1.0)


def generate(
    root: Path,
    *,
    events: int,
    days: float,
    end: float,
    seed: int = 1,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Write about `events` events over the `days` before `end` (Unix seconds); returns how many."""
    rng = random.Random(seed)
    consumers = _consumers(rng)
    by_region = {r: [c for c in consumers if c.region == r] for r in range(REGIONS)}
    topics = [f"ALL:REGION{r}:SENSOR{s}" for r in range(REGIONS) for s in range(SENSORS)]
    rng.shuffle(topics)
    topic_cum = _zipf_cum(len(topics), 1.1)
    publishers = [f"pub{i}" for i in range(PUBLISHERS)]
    pub_cum = _zipf_cum(len(publishers), 1.0)
    fanout = sum(len(v) for v in by_region.values()) / REGIONS
    per_message = 1 + 2 * fanout * 1.02  # accepted + (attempt + delivered) per subscription
    messages = max(1, int(events / per_message))
    start = end - days * 86400
    hours = [start + h * 3600 for h in range(max(1, math.ceil(days * 24)))]
    weights = [_load(datetime.fromtimestamp(h, tz=UTC)) for h in hours]
    total_w = sum(weights)
    written = 0
    v, node = SCHEMA_VERSION, NODE
    dumps = json.dumps
    for i, h0 in enumerate(hours):
        n = round(messages * weights[i] / total_w)
        lines: list[str] = []
        add = lines.append
        if i == 0:
            for c in consumers:
                add(
                    f'{{"v":{v},"type":"subscription","ts":{h0:.3f},"node":"{node}",'
                    f'"sub":"{c.sub}","action":"created","consumer":"{c.label}",'
                    f'"topic":"ALL:REGION{c.region}"}}'
                )
        frac = (h0 - start) / max(end - start, 1)
        ts_list = sorted(h0 + rng.random() * 3600 for _ in range(n))
        chosen = rng.choices(topics, cum_weights=topic_cum, k=n)
        pubs = rng.choices(publishers, cum_weights=pub_cum, k=n)
        for ts, topic, pub in zip(ts_list, chosen, pubs, strict=True):
            nid = f"{int(ts * 1000):012x}{rng.getrandbits(80):020x}"
            big = rng.random() < 0.02
            size = int(rng.lognormvariate(11.5, 1.0)) if big else int(rng.lognormvariate(6.4, 0.6))
            if rng.random() < 0.05:
                pub = ""
            if big and size > FRAGMENT_SIZE:
                ident = f"{rng.getrandbits(64):016x}"
                count = math.ceil(size / FRAGMENT_SIZE)
                for off in range(count):
                    more = "true" if off < count - 1 else "false"
                    add(
                        f'{{"v":{v},"type":"fragment","ts":{ts - 0.001 * (count - off):.3f},'
                        f'"node":"{node}","topic":"{topic}","ident":"{ident}","offset":{off},'
                        f'"more":{more},"bytes":{min(FRAGMENT_SIZE, size - off * FRAGMENT_SIZE)}}}'
                    )
            policy = "reliable" if topic.startswith(("ALL:REGION0:", "ALL:REGION1:")) else "fast"
            add(
                f'{{"v":{v},"type":"accepted","ts":{ts:.3f},"node":"{node}","nid":"{nid}",'
                f'"topic":"{topic}","publisher":"{pub}","policy":"{policy}","bytes":{size}}}'
            )
            region = int(topic[10 : topic.index(":", 10)])
            for c in by_region[region]:
                if rng.random() < 0.001:
                    add(
                        f'{{"v":{v},"type":"expired","ts":{ts + 60:.3f},"node":"{node}",'
                        f'"sub":"{c.sub}","consumer":"{c.label}","topic":"ALL:REGION{region}",'
                        '"messages":1}'
                    )
                    continue
                base = c.latency_ms * (1 + 4 * frac if c.slowing else 1)
                t = ts
                for attempt in range(1, 5):
                    lat = rng.lognormvariate(math.log(base), 0.5)
                    t += lat / 1000
                    ok = rng.random() >= c.fail_p
                    status = 200 if ok else (503 if rng.random() < 0.7 else "null")
                    error = "ok" if ok else ("http_5xx" if status == 503 else "timeout")
                    add(
                        f'{{"v":{v},"type":"attempt","ts":{t:.3f},"node":"{node}",'
                        f'"sub":"{c.sub}","consumer":"{c.label}","batch":"{nid}","messages":1,'
                        f'"bytes":{size},"status":{status},"error":"{error}",'
                        f'"duration_ms":{lat / 3:.2f}}}'
                    )
                    if ok:
                        add(
                            f'{{"v":{v},"type":"delivered","ts":{t:.3f},"node":"{node}",'
                            f'"nid":"{nid}","sub":"{c.sub}","consumer":"{c.label}",'
                            f'"latency_ms":{(t - ts) * 1000:.3f}}}'
                        )
                        break
                    if attempt == 4:
                        add(
                            f'{{"v":{v},"type":"dead_lettered","ts":{t:.3f},"node":"{node}",'
                            f'"nid":"{nid}","sub":"{c.sub}","consumer":"{c.label}",'
                            '"reason":"exhausted"}'
                        )
                        break
                    t += 2.0**attempt  # the retry schedule
        if rng.random() < 0.05:
            c = rng.choice([c for c in consumers if c.fail_p > 0.1])
            for action, dt in (("suspended", 100.0), ("resumed", 1900.0)):
                add(
                    f'{{"v":{v},"type":"subscription","ts":{h0 + dt:.3f},"node":"{node}",'
                    f'"sub":"{c.sub}","action":"{action}","consumer":"{c.label}",'
                    f'"topic":"ALL:REGION{c.region}"}}'
                )
        for _ in range(max(1, n // 2000)):
            add(
                dumps(
                    {
                        "v": v,
                        "type": "refused",
                        "ts": h0 + rng.random() * 3600,
                        "node": node,
                        "action": "Notify",
                        "publisher": rng.choice(["", "mallory", "pub7"]),
                        "reason": rng.choice(["TopicNotSupportedFault", "NotAuthorized"]),
                    },
                    separators=(",", ":"),
                )
            )
        if not lines:
            continue
        folder = partition_dir(root, h0)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"events-synth-{seed}-{int(h0)}.jsonl.gz"
        with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as f:
            f.write("\n".join(lines))
            f.write("\n")
        written += len(lines)
        if progress is not None:
            progress(written)
    return written
