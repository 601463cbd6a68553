"""Consumer health: attempts, failure rate by status class, retries per delivered message, dead
letters, suspensions and mean time to recover, per consumer (host:port).

A batch's attempts are numbered by time within (subscription, batch): every attempt after the
first is a retry. A failure episode starts at a failed attempt that follows a success (or none)
and ends at the subscription's next successful attempt; its length is a time to recover.
"""

from __future__ import annotations

import sys

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from spark.jobs.common import (
    JobConfig,
    default_extract,
    in_range,
    job_main,
    load_parquet,
    of_type,
    sub_consumers,
)

NAME = "consumer_health"
ERROR_CLASSES = ("http_4xx", "http_5xx", "timeout", "connect", "refused")


def extract(spark: SparkSession, cfg: JobConfig, uri: str) -> DataFrame:
    return default_extract(spark, cfg, uri)


def _attempts(df: DataFrame) -> DataFrame:
    # Ties in `ts` (milliseconds) broken by the other columns: the same input gives the same
    # episodes however Spark split it into partitions.
    by_batch = Window.partitionBy("sub", "batch").orderBy("ts", "error", "messages")
    by_sub = Window.partitionBy("sub").orderBy("ts", "batch", "error", "messages")
    upto = by_sub.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    a = (
        of_type(df, "attempt")
        .select("ts", "sub", "batch", "consumer", "messages", "error")
        .withColumn("ok", F.col("error") == "ok")
        .withColumn("n", F.row_number().over(by_batch))
        .withColumn("prev_ok", F.lag("ok").over(by_sub))
    )
    a = a.withColumn(
        "episode_start",
        F.when(~F.col("ok") & F.coalesce(F.col("prev_ok"), F.lit(True)), F.col("ts")),
    ).withColumn("since_fail", F.last("episode_start", ignorenulls=True).over(upto))
    return a.withColumn(
        "recover_s",
        F.when(F.col("ok") & (F.col("prev_ok") == F.lit(False)), F.col("ts") - F.col("since_fail")),
    )


def transform(df: DataFrame, *, cfg: JobConfig) -> DataFrame:
    df = in_range(df, cfg)
    a = _attempts(df)
    per_class = [
        F.sum(F.when(F.col("error") == c, 1).otherwise(0)).cast("long").alias(c)
        for c in ERROR_CLASSES
    ]
    attempts = a.groupBy("consumer").agg(
        F.count("*").alias("attempts"),
        F.sum(F.when(~F.col("ok"), 1).otherwise(0)).cast("long").alias("failures"),
        *per_class,
        F.sum(F.when(F.col("n") > 1, F.col("messages")).otherwise(0))
        .cast("long")
        .alias("retried_messages"),
        F.avg("recover_s").alias("mttr_s"),
        F.count("recover_s").alias("recoveries"),
    )
    delivered = of_type(df, "delivered").groupBy("consumer").agg(F.count("*").alias("delivered"))
    dead = of_type(df, "dead_lettered").groupBy("consumer").agg(F.count("*").alias("dead_letters"))
    suspended = (
        of_type(df, "subscription")
        .where(F.col("action") == "suspended")
        .join(sub_consumers(df), "sub", "left")
        .groupBy(F.col("sub_consumer").alias("consumer"))
        .agg(F.count("*").alias("suspensions"))
    )
    out = (
        attempts.join(delivered, "consumer", "full")
        .join(dead, "consumer", "full")
        .join(suspended, "consumer", "full")
        .where(F.col("consumer").isNotNull())
        .na.fill(0, ["attempts", "failures", "retried_messages", "recoveries", "delivered"])
        .na.fill(0, ["dead_letters", "suspensions", *ERROR_CLASSES])
    )
    return out.select(
        "consumer",
        "attempts",
        "failures",
        F.when(F.col("attempts") > 0, F.col("failures") / F.col("attempts")).alias("failure_rate"),
        *ERROR_CLASSES,
        "delivered",
        F.when(F.col("delivered") > 0, F.col("retried_messages") / F.col("delivered")).alias(
            "retries_per_delivered"
        ),
        "dead_letters",
        "suspensions",
        "recoveries",
        "mttr_s",
    )


def load(df: DataFrame, *, out: str) -> str:
    return load_parquet(df, out=out, name=NAME)


def main(argv: list[str] | None = None) -> int:
    return job_main(NAME, extract, transform, argv)


if __name__ == "__main__":
    sys.exit(main())
