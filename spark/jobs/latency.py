"""Publish-to-delivery latency percentiles (p50/p95/p99/max) per topic and per consumer, overall
and per time bucket (`percentile_approx`, rank error at most 1/PERCENTILE_ACCURACY)."""

from __future__ import annotations

import sys

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark.jobs.common import (
    PERCENTILE_ACCURACY,
    JobConfig,
    default_extract,
    in_range,
    job_main,
    load_parquet,
    of_type,
    topics_of,
)

NAME = "latency"


def extract(spark: SparkSession, cfg: JobConfig, uri: str) -> DataFrame:
    return default_extract(spark, cfg, uri)


def _percentiles(df: DataFrame, keys: list[str]) -> DataFrame:
    q = F.percentile_approx("latency_ms", [0.5, 0.95, 0.99], PERCENTILE_ACCURACY)
    return (
        df.groupBy(*keys)
        .agg(F.count("*").alias("count"), q.alias("q"), F.max("latency_ms").alias("max_ms"))
        .select(
            *keys,
            "count",
            F.col("q")[0].alias("p50_ms"),
            F.col("q")[1].alias("p95_ms"),
            F.col("q")[2].alias("p99_ms"),
            "max_ms",
        )
    )


def transform(df: DataFrame, *, cfg: JobConfig) -> DataFrame:
    df = in_range(df, cfg)
    delivered = (
        of_type(df, "delivered")
        .where(F.col("latency_ms").isNotNull())
        .join(topics_of(df), "nid", "left")
        .select(
            F.date_trunc(cfg.latency_grain, "at").alias("bucket"),
            F.coalesce("msg_topic", F.lit("(unknown)")).alias("topic"),
            "consumer",
            "latency_ms",
        )
    )
    out = None
    for dimension in ("topic", "consumer"):
        keyed = delivered.select("bucket", F.col(dimension).alias("key"), "latency_ms")
        overall = _percentiles(keyed, ["key"]).withColumn("bucket", F.lit(None).cast("timestamp"))
        per_bucket = _percentiles(keyed, ["key", "bucket"])
        both = overall.unionByName(per_bucket).withColumn("dimension", F.lit(dimension))
        out = both if out is None else out.unionByName(both)
    assert out is not None
    return out.select("dimension", "key", "bucket", "count", "p50_ms", "p95_ms", "p99_ms", "max_ms")


def load(df: DataFrame, *, out: str) -> str:
    return load_parquet(df, out=out, name=NAME)


def main(argv: list[str] | None = None) -> int:
    return job_main(NAME, extract, transform, argv)


if __name__ == "__main__":
    sys.exit(main())
