"""Closed hours compacted to Parquet give the jobs exactly what the raw JSON gives them."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest

from spark.compaction import compact
from spark.eventlog import COMPACT_DIR, MANIFEST, hours_to_compact, manifest_read
from spark.jobs import JOBS
from spark.jobs.common import JobConfig, local_root, read_events
from tests.spark import handbuilt as hb

CFG = JobConfig(since=hb.T0, until=hb.UNTIL, top_n=3)
NOW = hb.UNTIL + 2 * 3600  # every hour of the log is closed


def _sorted_rows(df):  # type: ignore[no-untyped-def]
    return sorted((tuple(r) for r in df.collect()), key=repr)


def _read(spark, root, *, compacted):  # type: ignore[no-untyped-def]
    return read_events(
        spark,
        uri=root.as_uri(),
        since=CFG.previous_since,
        until=CFG.until,
        compacted=compacted,
    )


@pytest.fixture(scope="module")
def logs(tmp_path_factory):  # type: ignore[no-untyped-def]
    raw = tmp_path_factory.mktemp("raw")
    hb.write(raw)
    compacted = tmp_path_factory.mktemp("compacted")
    shutil.copytree(raw, compacted, dirs_exist_ok=True)
    return raw, compacted


def test_a_compacted_log_gives_every_job_the_results_of_the_raw_json(spark, logs):  # type: ignore[no-untyped-def]
    import importlib

    raw, root = logs
    hours = len(hours_to_compact(root, now=NOW, since=CFG.previous_since, until=CFG.until))
    assert hours >= 6
    done = compact(spark, root=root, since=CFG.previous_since, until=CFG.until, now=NOW)
    assert done.hours == hours
    parquet = list((root / COMPACT_DIR).glob("date=*/hour=*/*.parquet"))
    assert parquet, "the hours were written as Parquet"
    # Read from the Parquet alone: hide the JSON the manifests name.
    for path in root.glob("date=*/hour=*/*.jsonl.gz"):
        path.rename(path.with_name("." + path.name))
    try:
        from_parquet = _read(spark, root, compacted=True).cache()
        from_json = _read(spark, raw, compacted=False).cache()
        assert (
            from_parquet.count()
            == from_json.count()
            == len([e for e in hb.events() if CFG.previous_since <= e["ts"] < CFG.until])
        )
        for name in JOBS:
            job = importlib.import_module(f"spark.jobs.{name}")
            want = _sorted_rows(job.transform(from_json, cfg=CFG))
            got = _sorted_rows(job.transform(from_parquet, cfg=CFG))
            assert got == want, name
            assert want, name
    finally:
        for path in root.glob("date=*/hour=*/.*.jsonl.gz"):
            path.rename(path.with_name(path.name[1:]))


def test_a_file_that_turns_up_in_a_compacted_hour_is_read_once(spark, tmp_path):  # type: ignore[no-untyped-def]
    hb.write(tmp_path)
    compact(spark, root=tmp_path, since=CFG.previous_since, until=CFG.until, now=NOW)
    before = _read(spark, tmp_path, compacted=True).count()
    assert before == _read(spark, tmp_path, compacted=False).count()
    assert compact(spark, root=tmp_path, since=CFG.since, until=CFG.until, now=NOW).hours == 0

    # A crashed process's file, compressed by the housekeeping after the hour was compacted.
    hour = next(tmp_path.glob("date=2026-11-02/hour=11"))
    late = {"v": 1, "type": "pull", "ts": hb.T0 + 3700, "node": "x:1", "pullpoint": "p"}
    late["messages"] = 3
    (hour / "events-late.jsonl.gz").write_bytes(gzip.compress(json.dumps(late).encode() + b"\n"))
    assert _read(spark, tmp_path, compacted=True).count() == before + 1
    # The next compaction takes it in; the hour is still counted once.
    assert compact(spark, root=tmp_path, since=CFG.since, until=CFG.until, now=NOW).hours == 1
    assert "events-late.jsonl.gz" in (
        manifest_read(tmp_path / COMPACT_DIR / hour.parent.name / hour.name) or {}
    )
    assert _read(spark, tmp_path, compacted=True).count() == before + 1


def test_open_and_recent_hours_are_left_as_json(tmp_path):  # type: ignore[no-untyped-def]
    hb.write(tmp_path)
    last = sorted(tmp_path.glob("date=*/hour=*"))[-1]
    (last / "events-open.jsonl").write_text("")
    since, until = CFG.previous_since, CFG.until + 3600
    closed = {h.name for h, _ in hours_to_compact(tmp_path, now=NOW, since=since, until=until)}
    assert last.name not in closed, "a plain .jsonl file: still open"
    # Within the grace after its end, an hour is not compacted either.
    just_after = hb.T0 + 3600 + 30
    hours = hours_to_compact(tmp_path, now=just_after, since=hb.T0, until=hb.T0 + 3600)
    assert [h.name for h, _ in hours] == ["hour=09"]
    assert not (tmp_path / COMPACT_DIR).exists()
    assert MANIFEST.startswith("_")  # Spark's listing of a directory skips it


def test_the_log_directory_of_a_file_uri_is_its_path_unquoted(tmp_path):  # type: ignore[no-untyped-def]
    # The default URI is the data directory's Path.as_uri(): a space in it is %20, and the hours
    # were listed (and compacted) in a directory of that name, which does not exist: every run
    # read 0 events.
    where = (tmp_path / "event log").resolve()
    assert local_root(where.as_uri()) == where
    assert local_root(str(where)) == where
    assert local_root("s3a://bucket/events") is None
