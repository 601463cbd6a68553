"""Top-N topics, publishers and consumers by volume and by failures, and the fan-out ratio per
topic (deliveries per published message)."""

from __future__ import annotations

import sys

from pyspark.sql import DataFrame, SparkSession, Window
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

NAME = "top_n"


def extract(spark: SparkSession, cfg: JobConfig, uri: str) -> DataFrame:
    return default_extract(spark, cfg, uri)


def _ranked(df: DataFrame, ranking: str, n: int) -> DataFrame:
    """df(key, value) -> its n largest values, ties broken by key."""
    w = Window.orderBy(F.col("value").desc(), F.col("key").asc())
    return (
        df.where(F.col("key").isNotNull() & (F.col("value") > 0))
        .withColumn("rank", F.row_number().over(w))
        .where(F.col("rank") <= n)
        .select(F.lit(ranking).alias("ranking"), "rank", "key", F.col("value").cast("double"))
    )


def transform(df: DataFrame, *, cfg: JobConfig) -> DataFrame:
    df = with_topics(in_range(df, cfg))
    n = cfg.top_n
    accepted = of_type(df, "accepted")
    attempts = of_type(df, "attempt")
    fails = attempts.where(failed())
    published = accepted.groupBy(F.col("topic").alias("key")).agg(F.count("*").alias("value"))
    delivered_by_topic = (
        of_type(df, "delivered")
        .groupBy(msg_topic(cfg).alias("key"))
        .agg(F.count("*").alias("delivered"))
    )
    fanout = published.join(delivered_by_topic, "key", "left").select(
        "key", (F.coalesce("delivered", F.lit(0)) / F.col("value")).alias("value")
    )
    tables = {
        "topics_by_volume": published,
        "publishers_by_volume": accepted.groupBy(
            F.when(F.col("publisher") == "", "(anonymous)")
            .otherwise(F.col("publisher"))
            .alias("key")
        ).agg(F.count("*").alias("value")),
        "consumers_by_volume": of_type(df, "delivered")
        .groupBy(F.col("consumer").alias("key"))
        .agg(F.count("*").alias("value")),
        "topics_by_failures": fails.groupBy(msg_topic(cfg).alias("key")).agg(
            F.count("*").alias("value")
        ),
        "consumers_by_failures": fails.groupBy(F.col("consumer").alias("key")).agg(
            F.count("*").alias("value")
        ),
        "publishers_by_refusals": of_type(df, "refused")
        .groupBy(
            F.when(F.coalesce("publisher", F.lit("")) == "", "(anonymous)")
            .otherwise(F.col("publisher"))
            .alias("key")
        )
        .agg(F.count("*").alias("value")),
        "topics_by_fanout": fanout,
    }
    out = None
    for ranking, table in tables.items():
        ranked = _ranked(table, ranking, n)
        out = ranked if out is None else out.unionByName(ranked)
    assert out is not None
    return out


def load(df: DataFrame, *, out: str) -> str:
    return load_parquet(df, out=out, name=NAME)


def main(argv: list[str] | None = None) -> int:
    return job_main(NAME, extract, transform, argv)


if __name__ == "__main__":
    sys.exit(main())
