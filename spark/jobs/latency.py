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
    msg_topic,
    of_type,
    with_topics,
)

NAME = "latency"


def extract(spark: SparkSession, cfg: JobConfig, uri: str) -> DataFrame:
    return default_extract(spark, cfg, uri)


def transform(df: DataFrame, *, cfg: JobConfig) -> DataFrame:
    df = with_topics(in_range(df, cfg))
    delivered = (
        of_type(df, "delivered")
        .where(F.col("latency_ms").isNotNull())
        .select(
            F.date_trunc(cfg.latency_grain, "at").alias("bucket"),
            "latency_ms",
            F.explode(
                F.array(
                    F.struct(
                        F.lit("topic").alias("dimension"),
                        msg_topic(cfg, "(unknown)").alias("key"),
                    ),
                    F.struct(F.lit("consumer").alias("dimension"), F.col("consumer").alias("key")),
                )
            ).alias("d"),
        )
    )
    # One aggregation for both: (key, bucket) and (key) over the whole range (not rollup's grand
    # total over every key, which the page never shows).
    q = F.percentile_approx("latency_ms", [0.5, 0.95, 0.99], PERCENTILE_ACCURACY)
    return (
        delivered.groupingSets([["d", "bucket"], ["d"]], "d", "bucket")
        .agg(
            F.count("*").alias("count"),
            q.alias("q"),
            F.max("latency_ms").alias("max_ms"),
            F.grouping("bucket").alias("overall"),
        )
        .where(F.col("d").isNotNull() & F.col("d.key").isNotNull())
        .select(
            F.col("d.dimension").alias("dimension"),
            F.col("d.key").alias("key"),
            F.when(F.col("overall") == 0, F.col("bucket")).alias("bucket"),
            "count",
            F.col("q")[0].alias("p50_ms"),
            F.col("q")[1].alias("p95_ms"),
            F.col("q")[2].alias("p99_ms"),
            "max_ms",
        )
    )


def load(df: DataFrame, *, out: str) -> str:
    return load_parquet(df, out=out, name=NAME)


def main(argv: list[str] | None = None) -> int:
    return job_main(NAME, extract, transform, argv)


if __name__ == "__main__":
    sys.exit(main())
