"""Message sizes (power-of-two buckets), fragments per fragmented message, and the hour-of-day x
weekday heatmap of published messages.

One table, `kind` saying which: `size` (x = bucket's lower bound in bytes), `fragments`
(x = fragments a message arrived in), `heatmap` (x = ISO weekday 1 Monday .. 7 Sunday,
y = hour UTC).
"""

from __future__ import annotations

import sys

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark.jobs.common import JobConfig, default_extract, in_range, job_main, load_parquet, of_type

NAME = "sizes"


def extract(spark: SparkSession, cfg: JobConfig, uri: str) -> DataFrame:
    return default_extract(spark, cfg, uri)


def size_bucket(col: Column) -> Column:
    """The largest power of two <= size (0 for an empty message), from the size's bit length."""
    bits = F.length(F.bin(col.cast("long")))
    return F.when(col <= 0, F.lit(0)).otherwise(F.pow(F.lit(2), bits - 1)).cast("long")


def transform(df: DataFrame, *, cfg: JobConfig) -> DataFrame:
    df = in_range(df, cfg)
    accepted = of_type(df, "accepted")
    sizes = (
        accepted.groupBy(size_bucket(F.coalesce("bytes", F.lit(0))).alias("x"))
        .agg(F.count("*").alias("count"))
        .select(
            F.lit("size").alias("kind"),
            F.col("x").cast("long"),
            F.lit(None).cast("long").alias("y"),
            "count",
        )
    )
    per_message = (
        of_type(df, "fragment").groupBy("topic", "ident").agg(F.countDistinct("offset").alias("n"))
    )
    fragments = (
        per_message.groupBy(F.col("n").alias("x"))
        .agg(F.count("*").alias("count"))
        .select(
            F.lit("fragments").alias("kind"),
            F.col("x").cast("long"),
            F.lit(None).cast("long").alias("y"),
            "count",
        )
    )
    # Spark's dayofweek is 1 = Sunday; ISO's weekday is 1 = Monday.
    iso_weekday = ((F.dayofweek("at") + 5) % 7) + 1
    heatmap = (
        accepted.groupBy(iso_weekday.alias("x"), F.hour("at").alias("y"))
        .agg(F.count("*").alias("count"))
        .select(
            F.lit("heatmap").alias("kind"),
            F.col("x").cast("long"),
            F.col("y").cast("long"),
            "count",
        )
    )
    return sizes.unionByName(fragments).unionByName(heatmap)


def load(df: DataFrame, *, out: str) -> str:
    return load_parquet(df, out=out, name=NAME)


def main(argv: list[str] | None = None) -> int:
    return job_main(NAME, extract, transform, argv)


if __name__ == "__main__":
    sys.exit(main())
