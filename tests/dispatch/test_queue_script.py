"""The fan-out's queue script (dispatch/fanout.py `_QUEUE`): every queue gets its items, and a
subscription goes on the ready list once, only when no pump was scheduled for it and it is not
paused. Against a Redis of the test's own."""

from __future__ import annotations

import time

from dispatch.fanout import queues_push
from hpwsn_site import state


def test_each_subscription_is_made_ready_once_and_only_when_no_pump_was_scheduled(own_redis):
    r = own_redis
    r.hset(state.SCHED, "scheduled", "1")  # its pump is on the ready list already
    queues = {
        ("a", 4): [b"n1|r1"],
        ("b", 4): [b"n1|r1"],
        ("scheduled", 4): [b"n1|r1"],
        ("a", 9): [b"n2|r2"],  # a again, in another group: still one wake-up
        ("d", 4): [b"n1|r1", b"n2|r2"],
        ("paused", 4): [b"n1|r1"],
    }
    before = time.time()

    lengths = queues_push(r, queues, {"paused"})

    assert [x.decode() for x in r.lrange(state.READY, 0, -1)] == ["a", "b", "d"]
    assert {x.decode() for x in r.smembers(state.BUSY)} == {"a", "b", "scheduled", "d", "paused"}
    marks = {k.decode(): float(v) for k, v in r.hgetall(state.SCHED).items()}
    assert marks["scheduled"] == 1.0
    assert "paused" not in marks
    assert all(marks[s] >= before - 1 for s in ("a", "b", "d"))
    for (sid, prio), items in queues.items():
        assert r.lrange(state.queue_key(sid, prio), 0, -1) == items
    assert r.hget(state.PRIOS, "a") == b"9"
    assert lengths == [state.queue_key("paused").encode(), 1]


def test_thousands_of_subscriptions_of_one_message_are_each_made_ready_once(own_redis):
    """Marks are read and set a thousand at a time: the chunks' edges lose or repeat nobody."""
    r = own_redis
    sids = [f"s{i}" for i in range(2_500)]
    scheduled = set(sids[990:1010] + sids[2_499:])
    r.hset(state.SCHED, mapping=dict.fromkeys(scheduled, "1"))

    queues_push(r, {(sid, 4): [b"n1|r1"] for sid in sids}, set())

    ready = [x.decode() for x in r.lrange(state.READY, 0, -1)]
    assert ready == [s for s in sids if s not in scheduled]
    assert r.hlen(state.SCHED) == len(sids)
    assert r.scard(state.BUSY) == len(sids)
    assert all(r.llen(state.queue_key(s)) == 1 for s in sids[::97])


def test_the_marks_an_earlier_version_kept_a_key_each_are_dropped_and_nothing_else(own_redis):
    """Before the marks hash each scheduled subscription had a key of its own, with no expiry; a
    Redis upgraded from then keeps them until a worker starts."""
    from hpwsn_site.celery import _legacy_marks_drop

    r = own_redis
    old = [f"{state.SCHED}:sub-{i}" for i in range(2_500)]
    for start in range(0, len(old), 500):
        r.mset({k: "1700000000.0" for k in old[start : start + 500]})
    r.hset(state.SCHED, "sub-1", "1")
    r.set(state.FANOUT_SCHED, "1")
    r.rpush(state.queue_key("sub-1"), b"n1|r1")

    assert state.legacy_marks_drop(r, chunk=1000) == 2_500
    assert r.exists(*old) == 0
    assert r.hget(state.SCHED, "sub-1") == b"1"
    assert r.exists(state.FANOUT_SCHED, state.queue_key("sub-1")) == 2
    r.set(f"{state.SCHED}:sub-x", "1")
    _legacy_marks_drop()  # what a worker does when it starts
    assert not r.exists(f"{state.SCHED}:sub-x")
