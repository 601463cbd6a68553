"""Traffic per topic and per subtree, per minute, hour and day: published, delivered, failed,
expired, bytes.

Delivered and failed are counted against the topic a message was published on (its `accepted`
event); expired against the subscribed topic (a wildcard subscription's, and messages expired
before the fan-out, count as "(unknown)"). A subtree row sums its own topic and every topic below
it (`ALL:ALARM` covers `ALL:ALARM:ALARM1`).
"""

from __future__ import annotations

import sys

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark.jobs.common import (
    JobConfig,
    default_extract,
    failed,
    in_range,
    job_main,
    load_parquet,
    msg_topic,
    of_type,
    with_topics,
)

NAME = "traffic"
GRAINS = ("minute", "hour", "day")
UNKNOWN = "(unknown)"


def extract(spark: SparkSession, cfg: JobConfig, uri: str) -> DataFrame:
    return default_extract(spark, cfg, uri)


def _facts(df: DataFrame, cfg: JobConfig) -> DataFrame:
    """One row per fact: (at, topic, published, delivered, failed, expired, bytes)."""
    zero = F.lit(0).cast("long")
    accepted = of_type(df, "accepted").select(
        "at",
        "topic",
        F.lit(1).cast("long").alias("published"),
        zero.alias("delivered"),
        zero.alias("failed"),
        zero.alias("expired"),
        F.coalesce(F.col("bytes"), zero).alias("bytes"),
    )
    delivered = of_type(df, "delivered").select(
        "at",
        msg_topic(cfg, UNKNOWN).alias("topic"),
        zero.alias("published"),
        F.lit(1).cast("long").alias("delivered"),
        zero.alias("failed"),
        zero.alias("expired"),
        zero.alias("bytes"),
    )
    fails = (
        of_type(df, "attempt")
        .where(failed())
        .select(
            "at",
            msg_topic(cfg, UNKNOWN).alias("topic"),
            zero.alias("published"),
            zero.alias("delivered"),
            F.coalesce(F.col("messages"), F.lit(1)).cast("long").alias("failed"),
            zero.alias("expired"),
            zero.alias("bytes"),
        )
    )
    expired = of_type(df, "expired").select(
        "at",
        F.coalesce(F.when(F.col("topic") != "", F.col("topic")), F.lit(UNKNOWN)).alias("topic"),
        zero.alias("published"),
        zero.alias("delivered"),
        zero.alias("failed"),
        F.col("messages").cast("long").alias("expired"),
        zero.alias("bytes"),
    )
    return accepted.unionByName(delivered).unionByName(fails).unionByName(expired)


def _scopes(topic: Column) -> Column:
    """ALL:A:B -> (topic, ALL:A:B) and (subtree, ALL), (subtree, ALL:A), (subtree, ALL:A:B)."""
    parts = F.split(topic, ":")
    subtrees = F.transform(
        F.sequence(F.lit(1), F.size(parts)),
        lambda n: F.struct(
            F.lit("subtree").alias("scope"), F.array_join(F.slice(parts, 1, n), ":").alias("name")
        ),
    )
    return F.concat(F.array(F.struct(F.lit("topic").alias("scope"), topic.alias("name"))), subtrees)


METRICS = ("published", "delivered", "failed", "expired", "bytes")


def _sums(df: DataFrame, *keys: Column | str) -> DataFrame:
    return df.groupBy(*keys).agg(*(F.sum(m).alias(m) for m in METRICS))


def transform(df: DataFrame, *, cfg: JobConfig) -> DataFrame:
    # Sums are additive: first per (minute, topic), which the map-side combine makes small, then
    # that is spread over its grains and scopes and summed again, in one pass.
    facts = _facts(with_topics(in_range(df, cfg)), cfg)
    minutes = _sums(facts, F.date_trunc("minute", "at").alias("at"), F.col("topic"))
    grains = F.array(
        *(F.struct(F.lit(g).alias("grain"), F.date_trunc(g, "at").alias("bucket")) for g in GRAINS)
    )
    spread = minutes.select(
        *METRICS,
        F.explode(_scopes(F.col("topic"))).alias("s"),
        F.explode(grains).alias("g"),
    )
    sums = _sums(
        spread,
        F.col("g.grain").alias("grain"),
        F.col("g.bucket").alias("bucket"),
        F.col("s.scope").alias("scope"),
        F.col("s.name").alias("topic"),
    )
    # Coarse grains first: a reader that keeps only the first rows (the page) keeps whole days
    # and hours before minutes. One partition sorted (the result is written as one file anyway)
    # rather than orderBy, whose range partitioning computes everything above it twice.
    order = F.when(F.col("grain") == "day", 0).when(F.col("grain") == "hour", 1).otherwise(2)
    return sums.repartition(1).sortWithinPartitions(order, "bucket", "scope", "topic")


def load(df: DataFrame, *, out: str) -> str:
    return load_parquet(df, out=out, name=NAME)


def main(argv: list[str] | None = None) -> int:
    return job_main(NAME, extract, transform, argv)


if __name__ == "__main__":
    sys.exit(main())
