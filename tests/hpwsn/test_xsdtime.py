from datetime import UTC, datetime, timedelta

import pytest

from hpwsn.xsdtime import TimeValueError, format_datetime, parse_duration, parse_termination

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "delta"),
    [
        ("PT1H", timedelta(hours=1)),
        ("PT0.5S", timedelta(seconds=0.5)),
        ("P1DT2H3M4S", timedelta(days=1, hours=2, minutes=3, seconds=4)),
        ("P2W", timedelta(days=14)),
        ("-PT5M", -timedelta(minutes=5)),
    ],
)
def test_it_reads_durations(text, delta):
    assert parse_duration(text) == delta


@pytest.mark.parametrize("text", ["P", "PT", "1H", "PTXS", "P1H"])
def test_it_rejects_invalid_durations(text):
    with pytest.raises(TimeValueError):
        parse_duration(text)


def test_a_termination_is_a_duration_from_now_or_an_absolute_time():
    assert parse_termination("PT10M", now=NOW) == NOW + timedelta(minutes=10)
    assert parse_termination("2026-01-02T00:00:00Z", now=NOW) == datetime(2026, 1, 2, tzinfo=UTC)
    assert parse_termination("2026-01-02T00:00:00", now=NOW).tzinfo is not None


@pytest.mark.parametrize("text", ["", "tomorrow", "2026-13-01T00:00:00Z"])
def test_it_rejects_unparsable_termination_times(text):
    with pytest.raises(TimeValueError):
        parse_termination(text, now=NOW)


def test_it_formats_utc_with_milliseconds():
    assert format_datetime(NOW) == "2026-01-01T00:00:00.000Z"
