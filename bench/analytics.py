"""Analytics jobs over a large generated event log, beside a single-process baseline.

    .venv/bin/python -m bench.analytics                        # 10^7 events, 7 days, local[*]
    .venv/bin/python -m bench.analytics --events 1000000 --master local[2] --json out.json

1. `spark.synth.generate` writes --events events over --days days (gzipped hour files, as the
   live writer leaves them) into a temporary directory.
2. Spark on --master reads the range once (JSON with the declared schema, cached), then runs every
   job of spark/jobs/ and writes its Parquet, as a run does: wall time and events/s per job.
3. A single Python process computes the same aggregations over the same files in one streaming
   pass (json.loads per line; exact percentiles by sorting), the baseline a team without Spark
   would write. Both are timed in the same run, so the ratio is visible.

Goal: all jobs over 10^7 events in under 2 minutes on local[*].
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spark.jobs import JOBS
from spark.jobs.common import JobConfig, read_events, session
from spark.synth import generate


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def spark_jobs(root: Path, out: Path, cfg: JobConfig, args: argparse.Namespace) -> dict[str, Any]:
    import importlib

    spark = session(
        master=args.master,
        app_name="hpwsn-bench",
        conf={
            "spark.sql.shuffle.partitions": str(args.shuffle_partitions),
            "spark.driver.memory": args.driver_memory,
            "spark.sql.files.maxPartitionBytes": "64m",
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    started = time.monotonic()
    events = read_events(spark, uri=root.as_uri(), since=cfg.previous_since, until=cfg.until)
    events = events.persist()
    rows = events.count()
    read_s = time.monotonic() - started
    log(f"spark: read and cached {rows:,} events in {read_s:.1f} s")
    jobs = {}
    for name in JOBS:
        module = importlib.import_module(f"spark.jobs.{name}")
        t = time.monotonic()
        path = module.load(module.transform(events, cfg=cfg), out=str(out))
        n = spark.read.parquet(path).count()
        secs = time.monotonic() - t
        jobs[name] = {"secs": round(secs, 2), "rows_out": n, "events_per_s": round(rows / secs)}
        log(f"spark: {name:16} {secs:7.1f} s  {n:>8} rows")
    total = time.monotonic() - started
    spark.stop()
    return {
        "events": rows,
        "read_secs": round(read_s, 2),
        "jobs": jobs,
        "total_secs": round(total, 2),
    }


def baseline(root: Path, cfg: JobConfig) -> dict[str, Any]:
    """Every job's aggregations in one streaming pass of one Python process."""
    started = time.monotonic()
    topic_of: dict[str, str] = {}
    traffic: Counter[tuple[str, int, str]] = Counter()  # (field, hour, topic)
    lat_consumer: dict[str, list[float]] = defaultdict(list)
    lat_topic_nids: list[tuple[str, float]] = []
    attempts: Counter[str] = Counter()
    failures: Counter[tuple[str, str]] = Counter()
    batches: Counter[tuple[str, str]] = Counter()
    retried: Counter[str] = Counter()
    delivered: Counter[str] = Counter()
    dead: Counter[str] = Counter()
    publishers: Counter[str] = Counter()
    sizes: Counter[int] = Counter()
    heat: Counter[tuple[int, int]] = Counter()
    frags: Counter[tuple[str, str]] = Counter()
    prev_lat: dict[str, list[float]] = defaultdict(list)
    prev_att: Counter[str] = Counter()
    prev_fail: Counter[str] = Counter()
    n = lines = 0
    files = sorted(root.glob("date=*/hour=*/*.jsonl*"))
    for path in files:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                e = json.loads(line)
                lines += 1
                ts = e["ts"]
                if ts < cfg.previous_since or ts >= cfg.until:
                    continue
                kind = e["type"]
                if ts < cfg.since:  # the period before (regressions)
                    if kind == "delivered":
                        prev_lat[e["consumer"]].append(e["latency_ms"])
                    elif kind == "attempt":
                        prev_att[e["consumer"]] += 1
                        prev_fail[e["consumer"]] += e["error"] != "ok"
                    continue
                n += 1
                hour = int(ts // 3600)
                if kind == "accepted":
                    topic_of[e["nid"]] = e["topic"]
                    traffic[("published", hour, e["topic"])] += 1
                    publishers[e["publisher"] or "(anonymous)"] += 1
                    b = e["bytes"]
                    sizes[1 << (b.bit_length() - 1) if b > 0 else 0] += 1
                    t = datetime.fromtimestamp(ts, tz=UTC)
                    heat[(t.isoweekday(), t.hour)] += 1
                elif kind == "delivered":
                    c = e["consumer"]
                    delivered[c] += 1
                    lat_consumer[c].append(e["latency_ms"])
                    lat_topic_nids.append((e["nid"], e["latency_ms"]))
                    traffic[("delivered", hour, topic_of.get(e["nid"], "(unknown)"))] += 1
                elif kind == "attempt":
                    c = e["consumer"]
                    attempts[c] += 1
                    key = (e["sub"], e["batch"])
                    batches[key] += 1
                    if batches[key] > 1:
                        retried[c] += e["messages"]
                    if e["error"] != "ok":
                        failures[(c, e["error"])] += 1
                        traffic[("failed", hour, topic_of.get(e["batch"], "(unknown)"))] += 1
                elif kind == "dead_lettered":
                    dead[e["consumer"]] += 1
                elif kind == "fragment":
                    frags[(e["topic"], e["ident"])] += 1
    parsed = time.monotonic() - started
    lat_topic: dict[str, list[float]] = defaultdict(list)
    for nid, ms in lat_topic_nids:
        lat_topic[topic_of.get(nid, "(unknown)")].append(ms)

    def pct(values: list[float]) -> tuple[float, float, float, float]:
        s = sorted(values)
        at = lambda p: s[max(0, math.ceil(p * len(s)) - 1)]  # noqa: E731
        return at(0.5), at(0.95), at(0.99), s[-1]

    latency = {k: pct(v) for k, v in lat_consumer.items()} | {
        k: pct(v) for k, v in lat_topic.items()
    }
    regress = {
        c: pct(lat_consumer[c])[2] - pct(v)[2] for c, v in prev_lat.items() if lat_consumer.get(c)
    }
    top = {
        "topics": Counter({k[2]: v for k, v in traffic.items() if k[0] == "published"}).most_common(
            10
        ),
        "publishers": publishers.most_common(10),
        "consumers": delivered.most_common(10),
    }
    total = time.monotonic() - started
    return {
        "events": lines,  # read and parsed, like Spark's read
        "events_in_range": n,
        "parse_secs": round(parsed, 2),
        "total_secs": round(total, 2),
        "figures": {
            "traffic_cells": len(traffic),
            "latency_keys": len(latency),
            "consumers": len(attempts),
            "dead_letters": sum(dead.values()),
            "retried": sum(retried.values()),
            "size_buckets": len(sizes),
            "heat_cells": len(heat),
            "fragmented_messages": len(frags),
            "regressions": len(regress),
            "top_topic": top["topics"][0] if top["topics"] else None,
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=10_000_000)
    p.add_argument("--days", type=float, default=7.0)
    p.add_argument("--master", default="local[*]")
    p.add_argument("--shuffle-partitions", type=int, default=8)
    p.add_argument("--driver-memory", default="6g")
    p.add_argument("--dir", default="", help="use (or reuse) this event log directory")
    p.add_argument("--keep", action="store_true", help="keep the generated log and outputs")
    p.add_argument("--no-baseline", dest="baseline", action="store_false")
    p.add_argument("--json", default="", help="write the figures to this file")
    args = p.parse_args(argv)

    work = Path(args.dir or tempfile.mkdtemp(prefix="hpwsn-bench-analytics-"))
    root, out = work / "events", work / "out"
    end = time.time()
    report: dict[str, Any] = {"events_asked": args.events, "days": args.days, "master": args.master}
    try:
        if not any(root.glob("date=*")):
            t = time.monotonic()
            # Over twice the range: the regressions job compares with the period before; every
            # job reads the whole log once (cached), then works on its range.
            n = generate(root, events=args.events, days=2 * args.days, end=end)
            report["generate_secs"] = round(time.monotonic() - t, 1)
            log(
                f"generated {n:,} events over {2 * args.days:g} days in {report['generate_secs']} s"
            )
        end = max(float(p.name.split("-")[-1].split(".")[0]) for p in root.rglob("*.gz")) + 3600
        cfg = JobConfig(since=end - args.days * 86400, until=end)
        report["spark"] = spark_jobs(root, out, cfg, args)
        if args.baseline:
            log("baseline: one Python process, one streaming pass over the same files")
            report["baseline"] = baseline(root, cfg)
            log(f"baseline: {report['baseline']['total_secs']} s")
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(work, ignore_errors=True)

    s = report["spark"]
    print(
        f"\nanalytics over {s['events']:,} events ({args.days:g} days; the regressions job also "
        f"reads the {args.days:g} days before), Spark {args.master}:"
    )
    print(f"{'job':<18}{'wall s':>9}{'events/s':>14}{'rows out':>10}")
    print(f"{'read + cache':<18}{s['read_secs']:>9.1f}{s['events'] / s['read_secs']:>14,.0f}")
    for name, j in s["jobs"].items():
        print(f"{name:<18}{j['secs']:>9.1f}{j['events_per_s']:>14,}{j['rows_out']:>10}")
    print(
        f"{'all (Spark)':<18}{s['total_secs']:>9.1f}{s['events'] / s['total_secs']:>14,.0f}"
        f"   goal: under 120 s {'MET' if s['total_secs'] < 120 else 'NOT MET'}"
    )
    if "baseline" in report:
        b = report["baseline"]
        print(
            f"{'baseline (1 proc)':<18}{b['total_secs']:>9.1f}"
            f"{b['events'] / b['total_secs']:>14,.0f}"
            f"   (of which JSON parse {b['parse_secs']:.1f} s)"
        )
        print(f"ratio baseline / Spark, all jobs: {b['total_secs'] / s['total_secs']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
