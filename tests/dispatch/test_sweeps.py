"""The stall sweep (the safety net): it restarts exactly the subscriptions whose work was lost,
with one script per thousand subscriptions instead of a round trip each."""

from __future__ import annotations

import time

from dispatch.sweeps import SCHEDULED_GRACE_S, stall_sweep
from hpwsn_site import state
from tests.dispatch.test_checkpoint import _subscription, _subscriptions


def _queued(r, sid: str, *, priority: int = 4) -> None:  # type: ignore[no-untyped-def]
    r.rpush(state.queue_key(sid, priority), b"n1|f0")
    r.sadd(state.BUSY, sid)


def _ready(r) -> list[str]:  # type: ignore[no-untyped-def]
    return [raw.decode() for raw in r.lrange(state.READY, 0, -1)]


def test_it_restarts_only_the_queues_no_pump_holds_nor_waits_for(db, own_redis):
    r = own_redis
    lost, old_mark, leased, retrying, waiting, empty, low = (_subscription() for _ in range(7))
    for sid in (lost, old_mark, leased, retrying, waiting):
        _queued(r, sid)
    _queued(r, low, priority=0)  # any priority counts
    r.sadd(state.BUSY, empty)  # nothing queued: the checkpoint takes it out
    # A pump killed after it took the id off the ready list: its mark stays, set long ago.
    r.hset(state.SCHED, old_mark, repr(time.time() - SCHEDULED_GRACE_S - 1))
    r.set(state.lease_key(leased), "a-live-pump", px=30_000)
    r.zadd(state.RETRY, {retrying: time.time() + 60})
    # Scheduled a moment ago: on the ready list behind others, its pump yet to start.
    r.hset(state.SCHED, waiting, repr(time.time()))

    assert stall_sweep() == 3

    assert sorted(_ready(r)) == sorted([lost, old_mark, low])
    for sid in (lost, old_mark, low):  # scheduled again, now
        assert float(r.hget(state.SCHED, sid)) > time.time() - 5


def test_thousands_of_busy_subscriptions_are_checked_in_a_few_calls(db, own_redis):
    r = own_redis
    sids = _subscriptions(2_500)
    for sid in sids:
        _queued(r, sid)
    r.set(state.lease_key(sids[7]), "a-live-pump", px=30_000)
    r.config_resetstat()

    assert stall_sweep() == 2_499

    stats = r.info("commandstats")
    assert stats["cmdstat_eval"]["calls"] == 3  # one script per thousand subscriptions
    assert stats["cmdstat_rpush"]["calls"] == 1  # and one wake-up for all they found
    ready = _ready(r)
    assert len(ready) == 2_499
    assert sids[7] not in ready


def test_an_id_still_on_a_long_ready_list_is_waiting_not_lost(db, own_redis):
    # Ten thousand busy subscriptions behind slow consumers: the ready list takes longer than
    # the grace to go round, and the marks of the ids still on it grow old meanwhile.
    r = own_redis
    waiting, lost = _subscription(), _subscription()
    for sid in (waiting, lost):
        _queued(r, sid)
        r.hset(state.SCHED, sid, repr(time.time() - SCHEDULED_GRACE_S - 60))
    r.rpush(state.READY, waiting)

    assert stall_sweep() == 1

    assert _ready(r) == [waiting, lost]  # the waiting one once, the lost one restarted


def test_a_pump_just_taken_off_a_long_ready_list_is_not_taken_for_lost(db, own_redis, monkeypatch):
    # Between the loop taking an id and its pump taking the lease, the id is neither waiting nor
    # leased; the loop stamps its mark when it takes it from a list with ids waiting, so their
    # wait does not count.
    from dispatch import pumploop

    r = own_redis
    first, second = _subscription(), _subscription()
    for sid in (first, second):
        _queued(r, sid)
        r.hset(state.SCHED, sid, repr(time.time() - SCHEDULED_GRACE_S - 60))  # a long wait
    r.rpush(state.READY, first, second)
    # However slow this machine, its BLPOP counts as answered at once: the list was not empty.
    monkeypatch.setattr(pumploop, "_AT_ONCE_S", 3600.0)
    loop = pumploop.PumpLoop(1)

    assert loop._take(r) == [first]  # by BLPOP, then stamped
    assert loop.backlog
    assert loop._take(r) == [second]  # taken and stamped in one script

    assert stall_sweep() == 0
    assert _ready(r) == []
    assert loop._take(r) == []  # the list is empty: back to waiting on it
    assert not loop.backlog


def test_an_id_the_loop_waited_for_is_taken_at_once(db, own_redis):
    import threading

    from dispatch.pumploop import PumpLoop

    r = own_redis
    # From another thread, with that thread's client, as a fan-out in another process would.
    threading.Timer(0.2, lambda: state.get_redis().rpush(state.READY, "s1")).start()

    assert PumpLoop(1)._take(r) == ["s1"]  # blocked on the empty list until it came


def test_the_loop_takes_as_many_ids_as_it_has_free_threads_in_one_round_trip(
    db, own_redis, monkeypatch
):
    # Ten thousand subscriptions on the ready list, sixteen pump threads: taken one at a time,
    # the loop was what pushes waited for (half the threads free at each take).
    import threading

    from dispatch import pumploop

    r = own_redis
    sids = [_subscription() for _ in range(10)]
    for sid in sids:
        _queued(r, sid)
        r.hset(state.SCHED, sid, repr(time.time() - SCHEDULED_GRACE_S - 60))  # a long wait
    r.rpush(state.READY, *sids)
    monkeypatch.setattr(pumploop, "_AT_ONCE_S", 3600.0)
    takes: list[int] = []
    script = pumploop._TAKE

    def counted(client, numkeys, *args):  # type: ignore[no-untyped-def]
        takes.append(int(args[-1]))  # how many ids it asked for
        return script(client, numkeys, *args)

    monkeypatch.setattr(pumploop, "_TAKE", counted)
    started: list[str] = []
    go_on = threading.Event()

    def pump(sid: str) -> None:  # a push in flight until the test lets it end
        started.append(sid)
        go_on.wait(10)

    loop = pumploop.PumpLoop(4, pump=pump)
    loop.start()
    try:
        deadline = time.monotonic() + 10
        while len(started) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # a loop that took more than it has threads for would have by now
        # The first id by BLPOP, the three the other threads can take in one script.
        assert sorted(started) == sorted(sids[:4])
        assert takes == [3]
        assert _ready(r) == sids[4:]  # the rest wait for a free thread, here or elsewhere
        for sid in sids[1:4]:  # stamped when taken: no stall alarm for their wait
            assert float(r.hget(state.SCHED, sid)) > time.time() - 5
        assert stall_sweep() == 0  # those taken are starting, the others waiting

        go_on.set()
        while len(started) < len(sids) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(started) == sorted(sids)  # each once
        assert _ready(r) == []
    finally:
        go_on.set()
        loop.stop(5)


def test_every_way_onto_the_ready_list_stamps_the_mark(db, own_redis):
    from dispatch.sweeps import retry_sweep
    from dispatch.wake import subscription_wake

    r = own_redis
    due, woken = _subscription(), _subscription()
    for sid in (due, woken):
        _queued(r, sid)
        r.hset(state.SCHED, sid, repr(time.time() - 3600))  # left by a pump that failed
    r.zadd(state.RETRY, {due: time.time() - 1, woken: time.time() + 3600})

    assert retry_sweep() == 1
    assert subscription_wake(subscription_id=woken)

    assert _ready(r) == [due, woken]
    for sid in (due, woken):
        assert float(r.hget(state.SCHED, sid)) > time.time() - 5
    assert stall_sweep() == 0


def test_the_retry_sweep_readies_a_thousand_due_subscriptions_in_a_few_round_trips(
    own_redis, monkeypatch
):
    from dispatch.sweeps import retry_sweep
    from tests.dispatch.test_fanout_lease import _round_trips

    r = own_redis
    due, later = [f"due-{i}" for i in range(1000)], "later"
    r.zadd(state.RETRY, {sid: time.time() - 1 for sid in due[:600]} | {later: time.time() + 60})
    r.zadd(state.ASIDE_DUE, {sid: time.time() - 1 for sid in due[400:]})  # 200 in both
    r.pipeline().ping().execute()  # the pipelines' connection open, as after the first sweep
    sent = _round_trips(monkeypatch)  # of this thread only: not a flusher's in the background

    assert retry_sweep() == 1000

    assert len(sent) <= 5
    assert sorted(_ready(r)) == sorted(due)  # each once
    assert [raw.decode() for raw in r.zrange(state.RETRY, 0, -1)] == [later]
    assert r.zcard(state.ASIDE_DUE) == 0
    assert all(float(m) > time.time() - 5 for m in r.hmget(state.SCHED, due))
