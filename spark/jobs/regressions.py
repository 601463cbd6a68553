"""Regressions: the consumers whose p99 latency or failure rate rose most against the period
before (of the same length), largest rise first."""

from __future__ import annotations

import sys

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark.jobs.common import (
    PERCENTILE_ACCURACY,
    JobConfig,
    job_main,
    load_parquet,
    of_type,
    read_events,
)

NAME = "regressions"


def extract(spark: SparkSession, cfg: JobConfig, uri: str) -> DataFrame:
    return read_events(spark, uri=uri, since=cfg.previous_since, until=cfg.until)


def _period(df: DataFrame, since: float, until: float, suffix: str) -> DataFrame:
    df = df.where((F.col("ts") >= since) & (F.col("ts") < until))
    lat = (
        of_type(df, "delivered")
        .groupBy("consumer")
        .agg(F.percentile_approx("latency_ms", 0.99, PERCENTILE_ACCURACY).alias(f"p99_{suffix}"))
    )
    att = (
        of_type(df, "attempt")
        .groupBy("consumer")
        .agg(
            (F.sum(F.when(F.col("error") != "ok", 1).otherwise(0)) / F.count("*")).alias(
                f"failure_rate_{suffix}"
            )
        )
    )
    return lat.join(att, "consumer", "full")


def transform(df: DataFrame, *, cfg: JobConfig) -> DataFrame:
    before = _period(df, cfg.previous_since, cfg.since, "before")
    now = _period(df, cfg.since, cfg.until, "now")
    both = before.join(now, "consumer", "inner").where(F.col("consumer").isNotNull())
    out = both.select(
        "consumer",
        "p99_before",
        "p99_now",
        (F.col("p99_now") - F.col("p99_before")).alias("p99_rise_ms"),
        "failure_rate_before",
        "failure_rate_now",
        (F.col("failure_rate_now") - F.col("failure_rate_before")).alias("failure_rate_rise"),
    )
    # Ordered by the larger of the two rises relative to the period before.
    score = F.greatest(
        F.coalesce(F.col("p99_rise_ms") / F.greatest(F.col("p99_before"), F.lit(1.0)), F.lit(0.0)),
        F.coalesce(F.col("failure_rate_rise"), F.lit(0.0)),
    )
    return (
        out.withColumn("score", score)
        .orderBy(F.col("score").desc(), F.col("consumer"))
        .limit(max(cfg.top_n, 1) * 5)
    )


def load(df: DataFrame, *, out: str) -> str:
    return load_parquet(df, out=out, name=NAME)


def main(argv: list[str] | None = None) -> int:
    return job_main(NAME, extract, transform, argv)


if __name__ == "__main__":
    sys.exit(main())
