"""The event log writer: buffered lines land in hour partitions, closed hours are gzipped,
abandoned files are compressed, old days are pruned (pure Python, no Django, no Spark)."""

from __future__ import annotations

import gzip
import json
import os
import threading
import time
from datetime import UTC, datetime

import pytest

from spark.eventlog import (
    FIELDS,
    SCHEMA_VERSION,
    TYPES,
    EventLog,
    compress,
    error_class,
    partition_globs,
    partitions_prune,
    stale_files_compress,
)
from tests.support import wait_until

H10 = datetime(2026, 11, 2, 10, 30, tzinfo=UTC).timestamp()


def _lines(path):  # type: ignore[no-untyped-def]
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_it_writes_each_hour_to_its_partition_and_gzips_the_hour_it_leaves(tmp_path):  # type: ignore[no-untyped-def]
    log = EventLog(tmp_path, flush_s=3600)  # only explicit flushes in this test
    log.emit("accepted", ts=H10, nid="a", topic="ALL:X", publisher="", policy="fast", bytes=3)
    log.emit("pull", ts=H10 + 1, pullpoint="p", messages=2)
    assert not list(tmp_path.rglob("*.jsonl*")), "buffered, not written per call"
    assert log.flush(now=H10 + 2) == 2
    open_file = next(tmp_path.glob("date=2026-11-02/hour=10/*.jsonl"))
    assert [e["type"] for e in _lines(open_file)] == ["accepted", "pull"]
    first = _lines(open_file)[0]
    assert first["v"] == SCHEMA_VERSION
    assert first["node"] == f"{os.uname().nodename}:{os.getpid()}"

    log.emit("pull", ts=H10 + 3600, pullpoint="p", messages=1)
    log.flush(now=H10 + 3600)
    assert wait_until(lambda: not open_file.exists())  # gzipped beside the writer
    closed = next(tmp_path.glob("date=2026-11-02/hour=10/*.jsonl.gz"))
    assert len(_lines(closed)) == 2
    log.close()
    assert [e["messages"] for e in _lines(next(tmp_path.glob("date=2026-11-02/hour=11/*.gz")))] == [
        1
    ]


def test_rows_emitted_together_read_back_as_the_same_events_one_by_one(tmp_path):  # type: ignore[no-untyped-def]
    """A batch of deliveries is written with its shared fields encoded once; a reader gets the
    same events as from one emit each, whatever the values (ids that need escaping included)."""
    rows = [
        ("0190f3a2b4c5d6e7f8a9b0c1d2e3f4a5", 12.5),
        ("id:3", None),
        ('a"b\\c\u00e9\n', 0.001),
        ("", 1e-07),
        ("x", float("nan")),
    ]
    same = {"sub": 'sub "7" at 100%s', "consumer": "127.0.0.1:9000"}
    one_by_one, together = EventLog(tmp_path / "a"), EventLog(tmp_path / "b")
    for nid, latency in rows:
        one_by_one.emit("delivered", ts=H10, nid=nid, latency_ms=latency, **same)
    together.emit_rows("delivered", H10, same, rows)
    one_by_one.flush(now=H10)
    together.flush(now=H10)
    read = [_lines(next((tmp_path / d).rglob("*.jsonl"))) for d in ("a", "b")]
    assert len(read[1]) == len(rows)
    # NaN is not equal to itself: compare the texts json gives back for each event.
    assert [json.dumps(e, sort_keys=True) for e in read[0]] == [
        json.dumps(e, sort_keys=True) for e in read[1]
    ]
    one_by_one.close()
    together.close()


class _HeldGzip:
    """eventlog.compress held until the test releases it; `real` is the one that does not wait."""

    def __init__(self) -> None:
        from spark import eventlog

        self.started, self.release = threading.Event(), threading.Event()
        self.real = eventlog.compress

    def __call__(self, path):  # type: ignore[no-untyped-def]
        self.started.set()
        assert self.release.wait(10)
        return self.real(path)


@pytest.fixture
def held_gzip(monkeypatch):  # type: ignore[no-untyped-def]
    from spark import eventlog

    held = _HeldGzip()
    monkeypatch.setattr(eventlog, "compress", held)
    return held


def _leave_hour_10(log: EventLog) -> int:
    """A line in hour 10 written, then one in hour 11: the log leaves hour 10."""
    log.emit("pull", ts=H10, pullpoint="p", messages=1)
    log.flush(now=H10)
    log.emit("pull", ts=H10 + 3600, pullpoint="p", messages=2)
    return log.flush(now=H10 + 3600)


def test_lines_are_written_while_the_hour_left_is_gzipped(tmp_path, held_gzip):  # type: ignore[no-untyped-def]
    """An hour of a busy broker's events takes a minute to gzip: the writer goes on meanwhile,
    rather than keeping what is emitted in memory until it is done."""
    log = EventLog(tmp_path, flush_s=3600)
    assert _leave_hour_10(log) == 1  # the hour left is still being gzipped
    log.emit("pull", ts=H10 + 3601, pullpoint="p", messages=3)
    assert log.flush(now=H10 + 3601) == 1
    written = next(tmp_path.glob("date=2026-11-02/hour=11/*.jsonl"))
    assert [e["messages"] for e in _lines(written)] == [2, 3]
    assert next(tmp_path.glob("date=2026-11-02/hour=10/*.jsonl"))  # not yet gzipped

    held_gzip.release.set()
    assert wait_until(lambda: list(tmp_path.glob("date=2026-11-02/hour=10/*.jsonl.gz")))
    assert not list(tmp_path.glob("date=2026-11-02/hour=10/*.jsonl"))
    log.close()


def test_a_closed_log_has_every_hour_it_left_gzipped(tmp_path, held_gzip, monkeypatch):  # type: ignore[no-untyped-def]
    """The compaction takes only hours whose files are all gzipped: once close() returns, none of
    the hours the log left is still plain JSON (nor half gzipped)."""
    from spark import eventlog

    log = EventLog(tmp_path, flush_s=3600)
    _leave_hour_10(log)
    assert held_gzip.started.wait(10)
    # The hour open at close() is gzipped at once; hour 10's gzip is released 0.3 s later.
    monkeypatch.setattr(eventlog, "compress", held_gzip.real)
    threading.Timer(0.3, held_gzip.release.set).start()
    log.close()
    assert held_gzip.release.is_set()
    assert not list(tmp_path.rglob("*.jsonl"))
    assert not list(tmp_path.rglob(".*"))  # no half-written gzip
    gzipped = [len(list(tmp_path.glob(f"date=2026-11-02/hour={h}/*.gz"))) for h in (10, 11)]
    assert gzipped == [1, 1]


def test_the_writer_thread_flushes_without_being_asked(tmp_path):  # type: ignore[no-untyped-def]
    log = EventLog(tmp_path, flush_s=0.05)
    log.emit("refused", action="Notify", publisher="", reason="TopicNotSupportedFault")
    deadline = time.monotonic() + 10
    while not list(tmp_path.rglob("*.jsonl")) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(_lines(next(tmp_path.rglob("*.jsonl")))) == 1
    log.close()


def test_housekeeping_compresses_abandoned_files_and_prunes_old_days(tmp_path):  # type: ignore[no-untyped-def]
    old = tmp_path / "date=2026-10-01" / "hour=00"
    old.mkdir(parents=True)
    (old / "events-a.jsonl.gz").write_bytes(gzip.compress(b"{}\n"))
    crashed = tmp_path / "date=2026-11-02" / "hour=09"
    crashed.mkdir(parents=True)
    (crashed / "events-b.jsonl").write_text('{"v":1}\n')
    os.utime(crashed / "events-b.jsonl", (H10 - 3600, H10 - 3600))
    assert stale_files_compress(tmp_path, now=H10) == 1
    assert _lines(crashed / "events-b.jsonl.gz") == [{"v": 1}]
    old_compacted = tmp_path / "_compact" / "date=2026-10-01" / "hour=00"
    old_compacted.mkdir(parents=True)
    (old_compacted / "_manifest.json").write_text('{"sources": {"events-a.jsonl.gz": 23}}')
    assert partitions_prune(tmp_path, now=H10, keep_days=30) == 1
    assert not old.parent.exists()
    assert not old_compacted.parent.exists(), "the Parquet of a pruned day goes with it"
    assert crashed.exists()


def test_the_read_globs_cover_the_range_with_an_hour_of_margin():  # type: ignore[no-untyped-def]
    since = datetime(2026, 11, 2, 10, 15, tzinfo=UTC).timestamp()
    until = datetime(2026, 11, 4, 1, 0, tzinfo=UTC).timestamp()
    globs = partition_globs(since, until)
    assert globs[0] == "date=2026-11-02/hour=09"
    assert "date=2026-11-03/hour=*" in globs
    assert globs[-1] == "date=2026-11-04/hour=02"


def test_every_type_names_declared_fields_and_errors_fall_in_bounded_classes():  # type: ignore[no-untyped-def]
    for fields in TYPES.values():
        assert set(fields) <= set(FIELDS)
    assert error_class(ok=True, status=200) == "ok"
    assert error_class(ok=False, status=503) == "http_5xx"
    assert error_class(ok=False, status=404, permanent=True) == "http_4xx"
    assert error_class(ok=False, status=None, detail="ReadTimeout: timed out") == "timeout"
    assert (
        error_class(ok=False, status=None, detail="refused by allow-list", permanent=True)
        == "refused"
    )
    assert error_class(ok=False, status=None, detail="ConnectError") == "connect"


def test_the_generated_demo_log_follows_the_schema(tmp_path):  # type: ignore[no-untyped-def]
    from django.core.management import call_command

    call_command("analytics_generate", "--events", "5000", "--days", "1", "--dir", str(tmp_path))
    files = sorted(tmp_path.glob("date=*/hour=*/*.jsonl.gz"))
    assert len(files) >= 20  # one per hour of the day
    events = [e for f in files for e in _lines(f)]
    assert 4000 < len(events) < 6500
    for e in events:
        assert e["v"] == SCHEMA_VERSION
        assert set(e) - {"v", "type", "ts", "node"} <= set(TYPES[e["type"]]), e
    kinds = {e["type"] for e in events}
    assert {"accepted", "attempt", "delivered", "subscription", "refused"} <= kinds
    failed = [e for e in events if e["type"] == "attempt" and e["error"] != "ok"]
    assert failed, "a few failing consumers"


def test_housekeeping_leaves_the_hour_just_ended_to_the_process_that_wrote_it(tmp_path):  # type: ignore[no-untyped-def]
    # A process that last wrote at 09:05 closes and gzips its file when 10:00 comes; the
    # housekeeping running at 10:01 would otherwise gzip the same file at the same time.
    hour = tmp_path / "date=2026-11-02" / "hour=09"
    hour.mkdir(parents=True)
    quiet = hour / "events-q.jsonl"
    quiet.write_text('{"v":1}\n')
    h09_05 = datetime(2026, 11, 2, 9, 5, tzinfo=UTC).timestamp()
    os.utime(quiet, (h09_05, h09_05))
    ten = datetime(2026, 11, 2, 10, 0, tzinfo=UTC).timestamp()

    assert stale_files_compress(tmp_path, now=ten + 60, idle_s=600) == 0
    assert quiet.exists()
    assert stale_files_compress(tmp_path, now=ten + 601, idle_s=600) == 1
    assert _lines(hour / "events-q.jsonl.gz") == [{"v": 1}]


def test_a_file_compressed_meanwhile_by_another_is_not_an_error(tmp_path):  # type: ignore[no-untyped-def]
    hour = tmp_path / "date=2026-11-02" / "hour=09"
    hour.mkdir(parents=True)
    path = hour / "events-a.jsonl"
    path.write_text("".join(f'{{"v":1,"n":{i}}}\n' for i in range(50_000)))

    assert compress(path) == hour / "events-a.jsonl.gz"
    assert compress(path) == hour / "events-a.jsonl.gz", "the second compressor found it done"
    assert len(_lines(hour / "events-a.jsonl.gz")) == 50_000


def test_two_compressors_at_once_leave_one_whole_file(tmp_path):  # type: ignore[no-untyped-def]
    hour = tmp_path / "date=2026-11-02" / "hour=09"
    hour.mkdir(parents=True)
    errors: list[BaseException] = []
    for round_ in range(5):
        path = hour / f"events-{round_}.jsonl"
        path.write_text("".join(f'{{"v":1,"n":{i}}}\n' for i in range(100_000)))
        start = threading.Barrier(2)

        def gzip_it(path=path, start=start):  # type: ignore[no-untyped-def]
            start.wait()
            try:
                compress(path)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=gzip_it) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [n["n"] for n in _lines(hour / f"events-{round_}.jsonl.gz")] == list(range(100_000))
        assert not path.exists()
    assert errors == []
    assert sorted(p.name for p in hour.iterdir()) == [f"events-{i}.jsonl.gz" for i in range(5)]


def test_rows_of_one_or_three_varying_fields_read_back_as_emitted_one_by_one(tmp_path):  # type: ignore[no-untyped-def]
    """The same as above for the other shapes of a row (two varying fields take a path of
    their own)."""
    cases = [
        ("expired", {"sub": "s%d", "consumer": "c"}, [("ALL:A", 3), ("B%s", 0)]),
        ("dead_lettered", {"reason": "exhausted"}, [("n1", "s1", "c1"), ('n"2', None, "c\n")]),
    ]
    for kind, same, rows in cases:
        fields = [f for f in TYPES[kind] if f not in same]
        a, b = EventLog(tmp_path / kind / "a"), EventLog(tmp_path / kind / "b")
        for row in rows:
            a.emit(kind, ts=H10, **same, **dict(zip(fields, row, strict=True)))
        b.emit_rows(kind, H10, same, rows)
        a.flush(now=H10)
        b.flush(now=H10)
        read = [_lines(next((tmp_path / kind / d).rglob("*.jsonl"))) for d in ("a", "b")]
        assert len(read[1]) == len(rows)
        assert [json.dumps(e, sort_keys=True) for e in read[0]] == [
            json.dumps(e, sort_keys=True) for e in read[1]
        ]
        a.close()
        b.close()


@pytest.mark.parametrize(
    "value",
    [
        "0190f3a2b4c5d6e7f8a9b0c1d2e3f4a5", "ALL:ALARM:ALARM1", "", 'a"b', "a\\b", "tab\there",
        "\x7f", "caf\u00e9", "100%s", 0, -7, 2**70, 12.5, 1e-07, float("nan"), float("inf"), None,
        True, False,
    ],
)  # fmt: skip
def test_an_emitted_line_is_the_json_encoders_own_text(tmp_path, value):  # type: ignore[no-untyped-def]
    """Lines are filled from a template kept per type and fields, each value encoded alone: the
    bytes are those the JSON encoder gives for the whole event, whatever the values and node."""
    log = EventLog(tmp_path, flush_s=3600)
    log.node = 'host "%s" 50%:1'
    log.emit("refused", ts=H10, action="Notify", publisher=value, reason=value)
    log.emit("refused", ts=1.5, reason=value)  # another set of fields: another template

    record = {"v": SCHEMA_VERSION, "type": "refused", "ts": H10, "node": log.node}
    encode = json.JSONEncoder(separators=(",", ":")).encode
    first = encode({**record, "action": "Notify", "publisher": value, "reason": value})
    second = encode({**record, "ts": 1.5, "reason": value})
    log.flush(now=H10)
    assert next(tmp_path.rglob("*.jsonl")).read_text(encoding="utf-8") == f"{first}\n{second}\n"
