"""The delay before the next attempt at a batch (dispatch.deliver.retry_delay)."""

from __future__ import annotations

import pytest

from dispatch.deliver import retry_delay

SCHEDULE = (0.0, 5.0, 300.0)


def test_it_follows_the_schedule_step_by_step_without_jitter():
    delays = [retry_delay(attempt=a, schedule=SCHEDULE, jitter=0) for a in (1, 2, 3)]
    assert delays == [0.0, 5.0, 300.0]


def test_it_gives_up_after_the_last_step():
    assert retry_delay(attempt=4, schedule=SCHEDULE, jitter=0) is None
    assert retry_delay(attempt=1, schedule=(), jitter=0) is None


def test_jitter_stays_within_its_bounds():
    delays = [retry_delay(attempt=3, schedule=SCHEDULE, jitter=0.2) for _ in range(500)]
    assert all(240.0 <= d <= 360.0 for d in delays if d is not None)
    assert len({round(d or 0, 3) for d in delays}) > 1  # it does vary


def test_retry_after_is_a_floor():
    assert retry_delay(attempt=2, schedule=SCHEDULE, jitter=0, retry_after=42) == 42
    assert retry_delay(attempt=3, schedule=SCHEDULE, jitter=0, retry_after=42) == 300


@pytest.mark.parametrize(("throttled", "expected"), [(True, 60.0), (False, 5.0)])
def test_throttled_failures_wait_at_least_the_minimum(throttled, expected):
    delay = retry_delay(
        attempt=2, schedule=SCHEDULE, jitter=0, throttled=throttled, throttled_min=60
    )
    assert delay == expected


def test_a_throttled_failure_with_a_longer_retry_after_waits_that_long():
    delay = retry_delay(
        attempt=1, schedule=SCHEDULE, jitter=0, retry_after=90, throttled=True, throttled_min=60
    )
    assert delay == 90


@pytest.mark.parametrize(
    ("status", "attempt", "expected"),
    [
        (429, 1, True),
        (503, 1, False),
        (503, 3, False),
        (None, 1, False),
        (None, 3, True),
        (500, 3, False),
    ],
)
def test_only_a_429_or_a_repeated_timeout_makes_the_consumer_wait_the_minimum(
    status, attempt, expected
):
    from dispatch.deliver import throttles
    from dispatch.push import Outcome

    outcome = Outcome(ok=False, status=status, throttled=status in (429, None))

    assert throttles(outcome, attempt) is expected
