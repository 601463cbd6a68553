"""Analytics jobs over a large generated event log, beside a single-process baseline.

    .venv/bin/python -m bench.analytics                        # 10^7 events, 7 days, local[*]
    .venv/bin/python -m bench.analytics --events 1000000 --master local[2] --json out.json

1. `spark.synth.generate` writes --events events over --days days (gzipped hour files, as the
   live writer leaves them) into a temporary directory.
2. Spark on --master runs every job of spark/jobs/ and writes its Parquet, as a run does, twice in
   one session: the old path reads the gzipped JSON (declared schema, cached) and each job joins
   the topics it needs; the new path compacts the closed hours to Parquet (timed apart: a run does
   it once per hour), reads the Parquet, joins the topics once and caches the columns the jobs
   read. Wall time per job,
   the JVM's CPU seconds, and whether both paths wrote the same rows.
3. A single Python process computes the same aggregations over the same files in one streaming
   pass (json.loads per line; exact percentiles by sorting), the baseline a team without Spark
   would write. All are timed in the same run, so the ratios are visible.

Goal: all jobs over 10^7 events in under 2 minutes on local[*].
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spark.compaction import compact
from spark.jobs import JOBS
from spark.jobs.common import JobConfig, for_jobs, read_events, session
from spark.synth import generate


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _jvm_cpu_s() -> float:
    """CPU seconds used so far by this process's children (the Spark JVM)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if int(stat[1]) == os.getpid():
            total += (int(stat[11]) + int(stat[12])) / ticks
    return total


def spark_session(args: argparse.Namespace) -> Any:
    spark = session(
        master=args.master,
        app_name="hpwsn-bench",
        conf={
            "spark.sql.shuffle.partitions": str(args.shuffle_partitions),
            "spark.driver.memory": args.driver_memory,
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def spark_jobs(spark: Any, root: Path, out: Path, cfg: JobConfig, *, path: str) -> dict[str, Any]:
    """Every job as a run does it. `json`: the log as the writers leave it (gzipped JSON), each
    job joining the topics it needs; `compacted`: closed hours compacted to Parquet first (timed
    apart: done once per hour), the topics joined once before the cache."""
    import importlib

    result: dict[str, Any] = {"path": path}
    if path == "compacted":
        t, cpu = time.monotonic(), _jvm_cpu_s()
        done = compact(spark, root=root, since=cfg.previous_since, until=cfg.until)
        result["compact_secs"] = round(time.monotonic() - t, 2)
        result["compact_cpu_secs"] = round(_jvm_cpu_s() - cpu, 1)
        secs = result["compact_secs"]
        log(f"{path}: compacted {done.hours} hours ({done.files} files) in {secs} s")
    started, cpu0 = time.monotonic(), _jvm_cpu_s()
    events = read_events(
        spark,
        uri=root.as_uri(),
        since=cfg.previous_since,
        until=cfg.until,
        compacted=path == "compacted",
    )
    if path == "compacted":
        events = for_jobs(events)
    events = events.persist()
    rows = events.count()
    read_s = time.monotonic() - started
    log(f"{path}: read and cached {rows:,} events in {read_s:.1f} s")
    jobs = {}
    for name in JOBS:
        module = importlib.import_module(f"spark.jobs.{name}")
        t = time.monotonic()
        written = module.load(module.transform(events, cfg=cfg), out=str(out / path))
        n = spark.read.parquet(written).count()
        secs = time.monotonic() - t
        jobs[name] = {"secs": round(secs, 2), "rows_out": n, "events_per_s": round(rows / secs)}
        log(f"{path}: {name:16} {secs:7.1f} s  {n:>8} rows")
    events.unpersist()
    total = time.monotonic() - started
    result.update(
        events=rows,
        read_secs=round(read_s, 2),
        jobs=jobs,
        total_secs=round(total, 2),
        cpu_secs=round(_jvm_cpu_s() - cpu0, 1),
    )
    return result


def same_results(spark: Any, out: Path) -> dict[str, Any]:
    """Per job: whether both paths wrote the same rows, and the largest relative difference of
    their floating-point columns (percentile_approx and sums of doubles depend on how the rows
    were split into partitions; every other column must be equal)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, FloatType

    same: dict[str, Any] = {}
    for name in JOBS:
        a = spark.read.parquet(str(out / "json" / name))
        b = spark.read.parquet(str(out / "compacted" / name))
        floats = [f.name for f in a.schema.fields if isinstance(f.dataType, DoubleType | FloatType)]
        keys = [c for c in a.columns if c not in floats]
        on = [F.col(f"a.{k}").eqNullSafe(F.col(f"b.{k}")) for k in keys]  # bucket may be null
        joined = a.alias("a").join(b.alias("b"), on, "full")
        diffs = [
            F.abs(F.col(f"a.{c}") - F.col(f"b.{c}"))
            / F.greatest(F.abs(F.col(f"a.{c}")), F.abs(F.col(f"b.{c}")), F.lit(1e-9))
            for c in floats
        ]
        unmatched = (
            joined.where(
                F.col(f"a.{floats[0]}").isNull() & F.col(f"b.{floats[0]}").isNotNull()
                | F.col(f"b.{floats[0]}").isNull() & F.col(f"a.{floats[0]}").isNotNull()
            )
            if floats
            else None
        )
        exact = a.count() == b.count() and a.exceptAll(b).isEmpty()
        worst = 0.0
        if diffs and not exact:
            worst = (
                joined.select(F.greatest(*diffs, F.lit(0.0)).alias("d")).agg(F.max("d")).first()[0]
            )
        same[name] = {
            "identical": exact,
            "keys_equal": a.select(keys).exceptAll(b.select(keys)).isEmpty()
            and b.select(keys).exceptAll(a.select(keys)).isEmpty()
            and (unmatched is None or unmatched.isEmpty()),
            "max_relative_difference": float(worst or 0.0),
        }
    return same


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
    p.add_argument(
        "--no-old-path", dest="old_path", action="store_false", help="skip the JSON-only path"
    )
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
        spark = spark_session(args)
        try:
            if args.old_path:
                report["json"] = spark_jobs(spark, root, out, cfg, path="json")
            report["compacted"] = spark_jobs(spark, root, out, cfg, path="compacted")
            if args.old_path:
                report["same_results"] = same_results(spark, out)
        finally:
            spark.stop()
        if args.baseline:
            log("baseline: one Python process, one streaming pass over the same files")
            report["baseline"] = baseline(root, cfg)
            log(f"baseline: {report['baseline']['total_secs']} s")
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(work, ignore_errors=True)
        elif args.dir:
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(root / "_compact", ignore_errors=True)  # the next run compacts anew

    paths = [p for p in ("json", "compacted") if p in report]
    s = report["compacted"]
    print(
        f"\nanalytics over {s['events']:,} events ({args.days:g} days; the regressions job also "
        f"reads the {args.days:g} days before), Spark {args.master}, wall seconds:"
    )
    print(
        f"{'job':<18}"
        + "".join(f"{p:>12}" for p in paths)
        + ("   ratio" if len(paths) == 2 else "")
    )

    def row(label: str, values: list[float]) -> None:
        ratio = f"{values[0] / values[1]:>8.2f}x" if len(values) == 2 and values[1] else ""
        print(f"{label:<18}" + "".join(f"{v:>12.1f}" for v in values) + ratio)

    if "compact_secs" in s:
        print(
            f"{'compact (once)':<18}" + " " * 12 * (len(paths) - 1) + f"{s['compact_secs']:>12.1f}"
        )
    row("read + cache", [report[p]["read_secs"] for p in paths])
    for name in JOBS:
        row(name, [report[p]["jobs"][name]["secs"] for p in paths])
    row("all jobs", [report[p]["total_secs"] for p in paths])
    row("JVM CPU s", [report[p]["cpu_secs"] for p in paths])
    print(
        f"all jobs, compacted log: {s['total_secs']:.1f} s, {s['events'] / s['total_secs']:,.0f} "
        f"events/s; goal under 120 s {'MET' if s['total_secs'] < 120 else 'NOT MET'}"
    )
    if "same_results" in report:
        print(f"same rows on both paths: {report['same_results']}")
    if "baseline" in report:
        b = report["baseline"]
        print(
            f"{'baseline (1 proc)':<18}{b['total_secs']:>9.1f} s "
            f"{b['events'] / b['total_secs']:>14,.0f} events/s"
            f"   (of which JSON parse {b['parse_secs']:.1f} s)"
        )
        ratio = b["total_secs"] / s["total_secs"]
        print(f"ratio baseline / Spark (compacted), all jobs: {ratio:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
