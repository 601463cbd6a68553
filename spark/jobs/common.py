"""What every job shares: the run's range, the session, reading the event log, writing Parquet."""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark.eventlog import FIELDS, hour_dirs, hour_sources, json_files

_TYPES: dict[str, T.DataType] = {
    "string": T.StringType(),
    "long": T.LongType(),
    "double": T.DoubleType(),
    "boolean": T.BooleanType(),
}

# percentile_approx's accuracy: the result's rank is within 1/ACCURACY of the exact one.
PERCENTILE_ACCURACY = 10_000


@dataclass(frozen=True, slots=True)
class JobConfig:
    since: float  # Unix seconds, inclusive
    until: float  # Unix seconds, exclusive
    top_n: int = 10
    latency_grain: str = "hour"  # the time buckets of the latency percentiles

    @property
    def previous_since(self) -> float:
        """The start of the period before this one, as long (the regressions job compares)."""
        return self.since - (self.until - self.since)


def events_schema() -> T.StructType:
    """The event log's schema (spark/eventlog.py FIELDS), read explicitly: no inference pass."""
    return T.StructType([T.StructField(name, _TYPES[kind], True) for name, kind in FIELDS.items()])


def session(
    *, master: str | None, app_name: str = "hpwsn-analytics", conf: dict[str, str] | None = None
) -> SparkSession:
    """A session on `master`; None leaves it to spark-submit's --master (else local[*])."""
    builder = SparkSession.builder
    if master:
        builder = builder.master(master)
    builder = (
        builder.appName(app_name)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def session_end(spark: SparkSession) -> None:
    """Stop the session and the JVM PySpark launched for it.

    SparkSession.stop() leaves that JVM running for the rest of the Python process: in a worker's
    pool process, after a nightly run, 1.4 GB held until the worker stops. The next session
    launches a JVM again (a few seconds, once a run).
    """
    from pyspark import SparkContext

    spark.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    SparkContext._gateway = None
    SparkContext._jvm = None
    proc = getattr(gateway, "proc", None)
    with contextlib.suppress(Exception):  # a gateway already gone
        gateway.shutdown()
    if proc is None:
        return
    # The JVM leaves when its stdin closes (PySpark's gateway server reads it for that).
    with contextlib.suppress(OSError):
        proc.stdin.close()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


def local_root(uri: str) -> Path | None:
    """The directory of a file:// (or plain path) event log URI; None for any other scheme."""
    parts = urlsplit(uri)
    if parts.scheme == "file":  # as Path.as_uri writes it (the default): %20 for a space
        return Path(unquote(parts.path))
    if parts.scheme == "":
        return Path(uri)
    return None


def read_events(
    spark: SparkSession, *, uri: str, since: float, until: float, compacted: bool = True
) -> DataFrame:
    """The events of [since, until) under `uri` (file://, hdfs://, s3a://, ...), with `at`.

    On a local file system only the date/hour partitions of the range are listed, and an hour
    compacted to Parquet (spark/compaction.py) is read from its Parquet instead of the JSON files
    it holds (`compacted=False` reads the JSON only); elsewhere the whole JSON tree is read and
    the partition columns prune it.
    """
    schema = events_schema()
    root = local_root(uri)
    if root is not None:
        parquet: list[str] = []
        jsonl: list[str] = []
        for hour_dir in hour_dirs(root, since, until):
            if compacted:
                pq, js = hour_sources(root, hour_dir)
            else:
                pq, js = [], json_files(hour_dir)
            parquet += [str(p) for p in pq]
            jsonl += [str(p) for p in js]
        parts = []
        if parquet:
            parts.append(spark.read.schema(schema).parquet(*parquet))
        if jsonl:
            parts.append(spark.read.schema(schema).json(jsonl))
        df = spark.createDataFrame([], schema) if not parts else parts[0]
        if len(parts) == 2:
            df = df.unionByName(parts[1])
    else:
        start = datetime.fromtimestamp(since - 3600, tz=UTC).date()
        end = datetime.fromtimestamp(until + 3600, tz=UTC).date()
        df = spark.read.schema(schema).json(uri)
        df = df.where(F.col("date").between(F.lit(start), F.lit(end)))
    df = df.select(*schema.fieldNames())
    return with_time(df.where((F.col("ts") >= since) & (F.col("ts") < until)))


def with_time(df: DataFrame) -> DataFrame:
    return df.withColumn("at", F.timestamp_seconds(F.col("ts")))


def in_range(df: DataFrame, cfg: JobConfig) -> DataFrame:
    return df.where((F.col("ts") >= cfg.since) & (F.col("ts") < cfg.until))


def of_type(df: DataFrame, kind: str) -> DataFrame:
    return df.where(F.col("type") == kind)


def topics_of(df: DataFrame) -> DataFrame:
    """nid -> topic, from the `accepted` events (the others carry the id only)."""
    return (
        of_type(df, "accepted")
        .select("nid", F.col("topic").alias("msg_topic"))
        .dropDuplicates(["nid"])
    )


def with_topics(df: DataFrame) -> DataFrame:
    """Every event with the topic and accept time of its message (`msg_topic`, `msg_ts`).

    A delivery or dead letter names its message (`nid`), an attempt its batch's first message
    (`batch`); the topic comes from that message's `accepted` event, null when it is not in
    `df`. One join, done once: a run adds these columns before it caches the events, so the jobs
    (which call this again) find them there and join nothing.
    """
    if "msg_topic" in df.columns:
        return df
    key = F.when(F.col("type").isin("accepted", "delivered", "dead_lettered"), F.col("nid")).when(
        F.col("type") == "attempt", F.col("batch")
    )
    topics = (
        of_type(df, "accepted")
        .select(
            F.col("nid").alias("_key"),
            F.col("topic").alias("msg_topic"),
            F.col("ts").alias("msg_ts"),
        )
        .dropDuplicates(["_key"])
    )
    # Hash the accepted side, stream the events: no sort of the large side.
    joined = df.withColumn("_key", key).join(topics.hint("shuffle_hash"), "_key", "left")
    return joined.drop("_key")


# The columns some job reads (the rest of the schema is for people and other tools).
JOB_COLUMNS = (
    "type",
    "ts",
    "at",
    "nid",
    "topic",
    "publisher",
    "bytes",
    "ident",
    "offset",
    "sub",
    "consumer",
    "batch",
    "messages",
    "error",
    "latency_ms",
    "action",
    "msg_topic",
    "msg_ts",
)


def for_jobs(df: DataFrame) -> DataFrame:
    """The events as every job reads them: the topics joined once, only the columns jobs use.

    A run caches this once for all its jobs: it is smaller than the events and no job joins.
    """
    return with_topics(df).select(*JOB_COLUMNS)


def msg_topic(cfg: JobConfig, unknown: str | None = None) -> Column:
    """The topic an event's message was published on, if it was published in the job's range
    (a message published before it counts as `unknown`)."""
    published = (F.col("msg_ts") >= cfg.since) & (F.col("msg_ts") < cfg.until)
    topic = F.when(published, F.col("msg_topic"))
    return topic if unknown is None else F.coalesce(topic, F.lit(unknown))


def sub_consumers(df: DataFrame) -> DataFrame:
    """sub -> consumer and subscribed topic, from the subscription lifecycle and the attempts."""
    created = of_type(df, "subscription").where(F.col("consumer") != "")
    attempts = of_type(df, "attempt")
    both = created.select("sub", "consumer", "topic").unionByName(
        attempts.select("sub", "consumer", F.lit(None).cast("string").alias("topic"))
    )
    return both.groupBy("sub").agg(
        F.first("consumer", ignorenulls=True).alias("sub_consumer"),
        F.first("topic", ignorenulls=True).alias("sub_topic"),
    )


def failed(col: str = "error") -> Column:
    return F.col(col) != "ok"


def load_parquet(df: DataFrame, *, out: str, name: str) -> str:
    """Write a job's result as Parquet under out/<name> (replacing an earlier one)."""
    path = os.path.join(out, name) if "://" not in out else out.rstrip("/") + "/" + name
    df.coalesce(1).write.mode("overwrite").parquet(path)
    return path


def parse_time(text: str) -> float:
    """ISO 8601 (naive means UTC) or Unix seconds."""
    try:
        return float(text)
    except ValueError:
        t = datetime.fromisoformat(text)
        return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


def job_main(
    name: str,
    extract: Callable[[SparkSession, JobConfig, str], DataFrame],
    transform: Callable[..., DataFrame],
    argv: list[str] | None = None,
) -> int:
    """`spark-submit spark/jobs/<name>.py --events URI --since T --until T --out DIR`."""
    p = argparse.ArgumentParser(prog=name)
    p.add_argument("--events", required=True, help="event log URI (file://, hdfs://, s3a://)")
    p.add_argument("--since", required=True, type=parse_time)
    p.add_argument("--until", required=True, type=parse_time)
    p.add_argument("--out", required=True, help="directory that receives <out>/<job>/ Parquet")
    # Unset: spark-submit's --master decides (a master set here would override it).
    p.add_argument("--master", default=os.environ.get("HPWSN_SPARK_MASTER"))
    p.add_argument("--top-n", type=int, default=10)
    args = p.parse_args(argv)
    cfg = JobConfig(since=args.since, until=args.until, top_n=args.top_n)
    spark = session(master=args.master, app_name=f"hpwsn-{name}")
    result = transform(extract(spark, cfg, args.events), cfg=cfg)
    try:
        path = load_parquet(result, out=args.out, name=name)
    finally:
        spark.stop()  # the application ends now, not when the interpreter does
    print(f"{name}: {path}", file=sys.stderr)
    return 0


def default_extract(spark: SparkSession, cfg: JobConfig, uri: str) -> DataFrame:
    return read_events(spark, uri=uri, since=cfg.since, until=cfg.until)


def rows_json(value: Any) -> Any:
    """A Parquet/Spark value as JSON for the page and CSV (timestamps as ISO 8601 UTC)."""
    if isinstance(value, datetime):
        t = value if value.tzinfo else value.replace(tzinfo=UTC)
        return t.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, float) and value != value:  # NaN
        return None
    return value
