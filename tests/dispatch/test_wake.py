"""dispatch.wake against a real Redis: what waits to be retried becomes due now, once."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from dispatch.wake import subscription_wake
from hpwsn_site import state


@pytest.fixture
def sent(_tasks_of_tests_without_the_platform):  # type: ignore[no-untyped-def]
    """The tasks queued by the test: (name, args)."""
    return _tasks_of_tests_without_the_platform


def test_it_makes_the_head_retry_and_every_batch_set_aside_due_now(sent):
    r = state.get_redis()
    sid = f"test-{uuid.uuid4().hex}"
    later = time.time() + 3600
    aside = [json.dumps({"items": [f"n{i}|r{i}"], "attempts": []}) for i in range(2)]
    try:
        r.zadd(state.RETRY, {sid: later})
        r.zadd(state.aside_key(sid), {aside[0]: later, aside[1]: later + 60})
        r.zadd(state.ASIDE_DUE, {sid: later})

        first = subscription_wake(subscription_id=sid)
        woken_at = time.time()
        second = subscription_wake(subscription_id=sid)

        assert (first, second) == (True, False)
        assert r.zscore(state.RETRY, sid) is None
        assert r.zscore(state.ASIDE_DUE, sid) is None
        assert all(
            score <= woken_at
            for _m, score in r.zrange(state.aside_key(sid), 0, -1, withscores=True)
        )
        assert r.zcard(state.aside_key(sid)) == 2  # nothing lost, nothing added
        assert r.lrange(state.READY, 0, -1) == [sid.encode()]  # its pump runs now
        assert sent == []
    finally:
        r.zrem(state.RETRY, sid)
        r.zrem(state.ASIDE_DUE, sid)
        r.delete(state.aside_key(sid))


def test_a_subscription_that_waits_for_nothing_is_left_alone(sent):
    sid = f"test-{uuid.uuid4().hex}"

    assert subscription_wake(subscription_id=sid) is False
    assert sent == []
    assert state.get_redis().llen(state.READY) == 0
