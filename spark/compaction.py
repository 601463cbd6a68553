"""Compact closed hours of the event log to Parquet, so that the jobs read columns, not JSON.

Parsing JSON is most of what a run over gzipped hour files costs (docs/benchmarks.md). An hour
stops changing once it is over: its files are gzipped within a second of the hour's end (a crashed
process's file by the housekeeping). One Spark job reads the closed hours that are not compacted
yet and writes each as Parquet under ``<root>/_compact/date=…/hour=…/``, beside a manifest naming
the JSON files it holds. The JSON files stay (they are the exported log); `read_events` takes an
hour's Parquet instead of the files its manifest names, and any other file as JSON, so a file that
turns up later is never skipped and never counted twice.

No Django: the analytics run calls it before its read, and so may a script or spark-submit.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark.eventlog import COMPACT_DIR, compacted_dir, hours_to_compact, manifest_write
from spark.jobs.common import events_schema

# The partition a line was read from, from its file's path (not from `ts`: a line lands in the
# hour its buffer was written, which may be the hour after it happened).
_PARTITION = r"/date=([^/]+)/hour=([^/]+)/[^/]+$"


@dataclass(frozen=True, slots=True)
class Compacted:
    hours: int  # partitions written
    files: int  # JSON files they hold


def compact(
    spark: SparkSession, *, root: Path, since: float, until: float, now: float | None = None
) -> Compacted:
    """Write the closed, not yet compacted hours of [since, until) under root as Parquet."""
    todo = hours_to_compact(root, now=time.time() if now is None else now, since=since, until=until)
    if not todo:
        return Compacted(hours=0, files=0)
    base = root / COMPACT_DIR
    staging = base / f".staging-{uuid.uuid4().hex}"
    paths = [str(hour_dir / name) for hour_dir, sources in todo for name in sources]
    try:
        path = F.input_file_name()
        (
            spark.read.schema(events_schema())
            .json(paths)
            .withColumn("_date", F.regexp_extract(path, _PARTITION, 1))
            .withColumn("_hour", F.regexp_extract(path, _PARTITION, 2))
            .write.partitionBy("_date", "_hour")
            .parquet(staging.as_uri())
        )
        for hour_dir, sources in todo:
            day, hour = hour_dir.parent.name[5:], hour_dir.name[5:]
            written = staging / f"_date={day}" / f"_hour={hour}"
            written.mkdir(parents=True, exist_ok=True)  # an hour of empty files has no Parquet
            # The manifest goes in before the directory is moved into place: a compacted hour
            # is never seen without the list of files it replaces.
            manifest_write(written, sources)
            _replace(compacted_dir(root, hour_dir), written)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Compacted(hours=len(todo), files=len(paths))


def _replace(target: Path, new: Path) -> None:
    """Move `new` to `target`, putting aside an older copy first (a re-compacted hour)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    old = None
    if target.exists():
        old = target.with_name(f".old-{target.name}-{uuid.uuid4().hex}")
        os.replace(target, old)
    os.replace(new, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
