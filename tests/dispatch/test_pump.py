"""The pump's bookkeeping against a real Redis: attempts at a head batch, flow control."""

from __future__ import annotations

import json
import uuid

from dispatch.deliver import ATTEMPT, ATTEMPTS_END
from hpwsn_site import state


def test_a_batch_from_another_queue_starts_its_own_count_and_ends_only_its_own():
    r = state.get_redis()
    key = state.attempts_key(f"test-{uuid.uuid4().hex}")

    def fail(head: bytes) -> int:
        return int(
            r.eval(ATTEMPT, 1, key, head, json.dumps({"status": 503, "head": head.decode()}))
        )

    try:
        # A priority-4 batch fails three times while it waits at its queue's head.
        assert [fail(b"n4|r10") for _ in range(3)] == [1, 2, 3]
        # A priority-9 batch overtakes it and fails: its first attempt, not the 4th.
        assert fail(b"n9|r11") == 1
        # Its success does not touch a count that is not its own ...
        r.eval(ATTEMPTS_END, 1, key, b"n4|r10")
        assert r.llen(key) == 1
        # ... and ends its own.
        r.eval(ATTEMPTS_END, 1, key, b"n9|r11")
        assert r.exists(key) == 0
    finally:
        r.delete(key)


def test_a_pump_waiting_for_room_in_the_window_does_not_spend_the_consumers_rate():
    from dispatch import flow
    from dispatch.deliver import flow_wait
    from dispatch.selectors import Limits

    r = state.get_redis()
    consumer = f"http://127.0.0.1:{uuid.uuid4().int % 50000 + 1000}"
    try:
        held = flow.window_acquire(r, consumer=consumer, n=10, window=10, hold_s=30)
        assert held  # another pump fills the window

        grant, wait = flow_wait(r, consumer, Limits(window=10, rate=100.0), 10)

        assert grant is None
        assert wait > 0
        # The whole burst is still there once the window has room.
        assert flow.rate_wait(r, consumer=consumer, n=100, rate=100.0) == 0
    finally:
        r.delete(flow.window_key(consumer), flow.rate_key(consumer))
