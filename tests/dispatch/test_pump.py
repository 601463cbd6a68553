"""The pump's bookkeeping against a real Redis: attempts at a head batch, flow control."""

from __future__ import annotations

import json
import time
import uuid

from dispatch.deliver import ATTEMPT, ATTEMPTS_END
from hpwsn_site import state


def _counting(monkeypatch) -> list[str]:  # type: ignore[no-untyped-def]
    """The Redis commands this thread sends from now on (pipelines apart)."""
    import threading

    import redis

    from dispatch import flow, pump

    calls: list[str] = []
    this = threading.get_ident()
    send = redis.Redis.execute_command
    # The pump's scripts by name, loaded as after the first run (else each is sent whole once).
    scripts = {"BEGIN": pump._BEGIN, "TAKE": pump._TAKE, "ACQUIRE": flow._ACQUIRE}
    for script in scripts.values():
        state.get_redis().script_load(script.body)
    names = {s.sha: name for name, s in scripts.items()}

    def counted(client, *args, **options):  # type: ignore[no-untyped-def]
        if threading.get_ident() == this:
            name = str(args[0]).upper()
            calls.append(names.get(args[1], name) if name == "EVALSHA" else name)
        return send(client, *args, **options)

    monkeypatch.setattr(redis.Redis, "execute_command", counted)
    return calls


def test_a_delivered_batch_lets_its_window_grant_go_in_its_take(
    db, own_redis, settings, monkeypatch
):
    """Flow control at work (two subscriptions share their consumer's window): a run of one batch
    makes the begin, the window's grant and the take, which lets the grant go with it. Before,
    the grant was let go in a call of its own after each push."""
    from dispatch import flow
    from dispatch.pump import Pump
    from dispatch.push import Outcome
    from tests.dispatch.test_checkpoint import _at, _subscription

    settings.HPWSN_CONSUMER_WINDOW = 2
    settings.HPWSN_CONSUMER_RATE = 0.0
    r = own_redis
    sub, _sharing = _subscription(), _subscription()
    _at(r, 0)
    for i in range(2):
        r.set(state.payload_key(f"p{i}"), b"<wsnt:Message/>")
        r.rpush(state.queue_key(sub), f"p{i}|f0".encode())
    r.hset(state.SCHED, sub, "1")
    window = flow.window_key("http://127.0.0.1:9")
    in_flight: list[int] = []

    def consumer(_entry, batch):  # type: ignore[no-untyped-def]
        in_flight.append(r.zcard(window))
        return Outcome(ok=True, status=200)

    calls = _counting(monkeypatch)
    delivered = Pump(sub, push=consumer, keep_alive=False).run()
    monkeypatch.undo()

    assert delivered == 2
    assert in_flight == [1]  # the grant, held while the batch was pushed
    assert [c for c in calls if c not in {"MGET", "EVALSHA", "ZCARD"}] == [
        "BEGIN",
        "ACQUIRE",
        "TAKE",
    ]
    assert r.zcard(window) == 0


def _fail(r, sub: str, head: bytes) -> int:  # type: ignore[no-untyped-def]
    """A failed attempt at the batch that starts with `head`; that batch's count."""
    queues = state.queue_keys(sub)
    record = json.dumps({"status": 503, "head": head.decode()})
    return int(r.eval(ATTEMPT, 1 + len(queues), state.attempts_key(sub), *queues, head, record))


def test_a_batch_from_another_queue_starts_its_own_count_and_ends_only_its_own():
    r = state.get_redis()
    sub = f"test-{uuid.uuid4().hex}"
    key = state.attempts_key(sub)
    try:
        r.rpush(state.queue_key(sub, 4), b"n4|r10")
        # A priority-4 batch fails three times while it waits at its queue's head.
        assert [_fail(r, sub, b"n4|r10") for _ in range(3)] == [1, 2, 3]
        # A priority-9 batch overtakes it and fails: its first attempt, not the 4th ...
        r.rpush(state.queue_key(sub, 9), b"n9|r11")
        assert _fail(r, sub, b"n9|r11") == 1
        # ... and the waiting head keeps its three.
        assert r.llen(key) == 4
        # Its success ends its own count only ...
        r.eval(ATTEMPTS_END, 1, key, b"n9|r11")
        assert [json.loads(a)["head"] for a in r.lrange(key, 0, -1)] == ["n4|r10"] * 3
        # ... and the waiting head's next failure is its 4th.
        r.lpop(state.queue_key(sub, 9))
        assert _fail(r, sub, b"n4|r10") == 4
        r.eval(ATTEMPTS_END, 1, key, b"n4|r10")
        assert r.exists(key) == 0
    finally:
        r.delete(key, *state.queue_keys(sub))


def test_a_head_left_another_way_loses_its_attempts_at_the_next_failure():
    r = state.get_redis()
    sub = f"test-{uuid.uuid4().hex}"
    key = state.attempts_key(sub)
    try:
        r.rpush(state.queue_key(sub), b"old|r1", b"new|r2")
        assert _fail(r, sub, b"old|r1") == 1
        r.lpop(state.queue_key(sub))  # dropped by a queue bound while the subscription paused

        assert _fail(r, sub, b"new|r2") == 1

        assert [json.loads(a)["head"] for a in r.lrange(key, 0, -1)] == ["new|r2"]
    finally:
        r.delete(key, *state.queue_keys(sub))


def test_a_higher_priority_batch_that_fails_leaves_the_waiting_heads_attempts_alone(
    db, own_redis, settings
):
    """The waiting batch gets 1 + len(schedule) attempts in all, and its dead letter holds each
    of them. Before, the overtaking batch's first failure deleted the three it had: it got nine
    attempts, and its letter showed the last six."""
    from dispatch.models import DeadLetter
    from dispatch.pump import Pump
    from dispatch.push import Outcome
    from tests.dispatch.test_checkpoint import _at, _subscription

    settings.HPWSN_CONSUMER_WINDOW = 0
    settings.HPWSN_RETRY_SCHEDULE_S = [0.0] * 5
    settings.HPWSN_RETRY_JITTER = 0.0
    settings.HPWSN_SUSPEND_AFTER_S = 3600
    r = own_redis
    sub = _subscription()
    _at(r, 0)
    pushed: list[str] = []
    answers = {"a": [503] * 10, "x": [503, 200]}

    def consumer(_entry, batch):  # type: ignore[no-untyped-def]
        ((nid, _payload),) = batch.live
        pushed.append(nid)
        status = answers[nid].pop(0)
        return Outcome(ok=status == 200, status=status, detail=f"{status} for {nid}")

    def run() -> None:
        r.zrem(state.RETRY, sub)  # due now: the schedule's steps are 0 s
        Pump(sub, push=consumer, keep_alive=False).run()

    r.set(state.payload_key("a"), b"<wsnt:Message/>")
    r.rpush(state.queue_key(sub, 4), b"a|f0")
    for _ in range(3):
        run()
    x_queued_at = time.time()
    r.set(state.payload_key("x"), b"<wsnt:Message/>")
    r.rpush(state.queue_key(sub, 9), b"x|f0")
    for _ in range(10):
        if not r.exists(*state.queue_keys(sub)):
            break
        run()

    assert pushed.count("x") == 2
    assert pushed.count("a") == 1 + len(settings.HPWSN_RETRY_SCHEDULE_S)
    letter = DeadLetter.objects.get(subscription_id=sub, notification_id="a")
    assert len(letter.attempts) == 1 + len(settings.HPWSN_RETRY_SCHEDULE_S)
    assert [a["detail"] for a in letter.attempts] == ["503 for a"] * 6
    assert [a["time"] < x_queued_at for a in letter.attempts] == [True] * 3 + [False] * 3
    assert r.exists(state.attempts_key(sub)) == 0


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


def test_a_run_makes_one_script_before_a_push_and_one_after(db, own_redis, settings, monkeypatch):
    """The lease, the retry state and the first batch come in one call; the take, the bookkeeping
    and the next batch (or the end of the run, which lets the lease go) in one call after each
    push. Before, a run of one batch made ten round trips."""
    from dispatch.pump import Pump
    from dispatch.push import Outcome
    from tests.dispatch.test_checkpoint import _at, _subscription

    settings.HPWSN_CONSUMER_WINDOW = 0
    settings.HPWSN_PUSH_BATCH = 2
    r = own_redis
    sub = _subscription()
    _at(r, 0)
    for i in range(3):
        r.set(state.payload_key(f"p{i}"), b"<wsnt:Message/>")
        r.rpush(state.queue_key(sub), f"p{i}|f0".encode())
    r.hset(state.SCHED, sub, "1")
    r.zadd(state.aside_key(sub), {json.dumps({"items": ["a|f0"], "attempts": []}): 4e9})
    pushed: list[list[str]] = []

    def consumer(_entry, batch):  # type: ignore[no-untyped-def]
        pushed.append([i for i, _p in batch.live])
        return Outcome(ok=True, status=200)

    calls = _counting(monkeypatch)
    delivered = Pump(sub, push=consumer, keep_alive=False).run()
    monkeypatch.undo()

    assert delivered == 3
    assert pushed == [["p0", "p1"], ["p2"]]
    # Besides the version checks of the process's caches (subscriptions and topics: the change
    # feed's script, EVALSHA, loaded once; consumer limits: MGET), the begin and one take after each
    # push.
    checks = {"MGET", "EVALSHA", "SCRIPT LOAD"}
    assert [c for c in calls if c not in checks] == ["BEGIN", "TAKE", "TAKE"]
    # The run's end, in the last take: the lease let go, the scheduled mark gone (the fan-out
    # makes the subscription ready again), the batch set aside registered for its due time.
    assert not r.exists(state.lease_key(sub), state.queue_key(sub))
    assert not r.hexists(state.SCHED, sub)
    assert r.zscore(state.ASIDE_DUE, sub) == 4e9


def test_a_renewal_that_fails_for_an_earlier_token_does_not_stop_the_pump_holding_the_lease_now():
    """The keeper renews from a copy of the leases it holds. A pump of the same subscription in
    this process may end, and the next one take the lease with its own token, while a round
    is on its way: the round's failure to renew the old token is not the new pump's loss
    (which would leave its pushed batch queued and its subscription unscheduled)."""
    from dispatch.pump import LeaseKeeper

    r = state.get_redis()
    key = state.lease_key(f"test-{uuid.uuid4().hex}")
    keeper = LeaseKeeper()
    try:
        keeper.held[key] = ("old", 30_000)  # the first pump's push, as the round read it
        snapshot = dict(keeper.held)
        r.set(key, "new", px=30_000)  # the first run ended; the second took the lease
        keeper.held[key] = ("new", 30_000)

        keeper.renew(r, snapshot)

        assert keeper.drop(key) is True
        assert r.get(key) == b"new"

        # The lease of the push being renewed is gone: that one is lost.
        keeper.held[key] = ("new", 30_000)
        r.set(key, "third", px=30_000)
        keeper.renew(r, dict(keeper.held))
        assert keeper.drop(key) is False
    finally:
        r.delete(key)


def _queued(r, sub: str, n: int) -> None:  # type: ignore[no-untyped-def]
    for i in range(n):
        r.set(state.payload_key(f"p{i}"), b"<wsnt:Message/>")
        r.rpush(state.queue_key(sub), f"p{i}|f0".encode())
    r.hset(state.SCHED, sub, "1")


def _recording(pushed: list[list[str]]):  # type: ignore[no-untyped-def]
    from dispatch.push import Outcome

    def consumer(_entry, batch):  # type: ignore[no-untyped-def]
        pushed.append([i for i, _p in batch.live])
        return Outcome(ok=True, status=200)

    return consumer


def test_a_run_on_current_caches_reads_nothing_before_its_script(db, own_redis, monkeypatch):
    """The subscription and its consumer's limits come from the process's caches; the script
    that takes the lease checks their markers. Before, each run read both first: two round
    trips more."""
    from dispatch.pump import Pump
    from dispatch.selectors import consumer_limits
    from tests.dispatch.test_checkpoint import _at, _subscription

    r = own_redis
    _at(r, 0)  # before the caches are built: an epoch marker to trust
    sub = _subscription()
    consumer_limits(consumer="http://127.0.0.1:9")
    _queued(r, sub, 1)
    pump = Pump(sub, push=_recording([]), keep_alive=False)

    calls = _counting(monkeypatch)
    assert pump.acquire()
    monkeypatch.undo()

    # (What may follow the script: the topic's policy, read at most once a second.)
    assert calls[0] == "BEGIN"
    assert "MGET" not in calls
    assert r.get(state.lease_key(sub)) == pump.token.encode()


def test_a_pause_made_elsewhere_after_the_caches_were_read_stops_the_next_run(
    db, own_redis, django_capture_on_commit_callbacks
):
    """The process's index still shows the subscription active (no thread has read the change
    yet); the script finds the markers moved, and the pump reads them before deciding."""
    from dispatch.pump import Pump
    from dispatch.selectors import consumer_limits
    from subscriptions import selectors as subscription_selectors
    from subscriptions.services import subscription_set_state
    from tests.dispatch.test_checkpoint import _at, _subscription

    r = own_redis
    _at(r, 0)  # before the caches are built: an epoch marker to trust
    sub = _subscription()
    consumer_limits(consumer="http://127.0.0.1:9")
    with django_capture_on_commit_callbacks(execute=True):
        subscription_set_state(subscription_id=sub, paused=True)
    held = subscription_selectors._index.peek()
    assert held is not None
    assert not held.by_id[sub].paused  # not read yet
    _queued(r, sub, 2)
    pushed: list[list[str]] = []

    assert Pump(sub, push=_recording(pushed), keep_alive=False).run() == 0

    assert pushed == []
    assert r.llen(state.queue_key(sub)) == 2  # waiting for the resume
    assert not r.exists(state.lease_key(sub))


def test_a_limit_set_elsewhere_after_the_caches_were_read_applies_to_the_next_run(
    db, own_redis, settings
):
    from dispatch.pump import Pump
    from dispatch.selectors import consumer_limits_cached
    from dispatch.services import consumer_limit_set
    from tests.dispatch.test_checkpoint import _at, _subscription

    settings.HPWSN_PUSH_BATCH = 10
    r = own_redis
    _at(r, 0)  # before the caches are built: an epoch marker to trust
    sub = _subscription()
    consumer = "http://127.0.0.1:9"
    pushed: list[list[str]] = []
    _queued(r, sub, 3)
    assert Pump(sub, push=_recording(pushed), keep_alive=False).run() == 3
    assert pushed == [["p0", "p1", "p2"]]

    consumer_limit_set(consumer=consumer, window=None, rate=1.0)  # one message a batch
    cached = consumer_limits_cached(consumer=consumer)
    assert cached is not None
    assert cached.value.rate == 0  # not read yet
    pushed.clear()
    _queued(r, sub, 3)
    Pump(sub, push=_recording(pushed), keep_alive=False).run()

    assert pushed[0] == ["p0"]


def test_a_consumer_that_drops_odd_requests_is_retried_within_seconds_and_a_429_waits(
    db, own_redis, settings
):
    """The default schedule and the throttled minimum as a consumer meets them: two 503s in a row
    are retried after the schedule's second step (1 s), not after the throttled minute that held
    a consumer refusing 5 % of its requests minutes behind; a 429 waits that minute at once."""
    from dispatch.pump import Pump
    from dispatch.push import Outcome
    from hpwsn_site import settings as defaults
    from tests.dispatch.test_checkpoint import _at, _subscription

    settings.HPWSN_RETRY_SCHEDULE_S = defaults.HPWSN_RETRY_SCHEDULE_S
    settings.HPWSN_RETRY_THROTTLED_MIN_S = defaults.HPWSN_RETRY_THROTTLED_MIN_S
    settings.HPWSN_RETRY_JITTER = 0.0
    settings.HPWSN_CONSUMER_WINDOW = 0
    r = own_redis
    _at(r, 0)

    def due_after(answers: list[Outcome]) -> list[float]:
        sub = _subscription()
        r.set(state.payload_key(f"m-{sub}"), b"<wsnt:Message/>")
        r.rpush(state.queue_key(sub), f"m-{sub}|f0".encode())
        waits = []
        for outcome in answers:
            r.hset(state.SCHED, sub, "1")
            before = time.time()
            Pump(sub, push=lambda _e, _b, o=outcome: o, keep_alive=False).run()
            waits.append(round(float(r.zscore(state.RETRY, sub)) - before))
            r.zrem(state.RETRY, sub)
        return waits

    unavailable = Outcome(ok=False, status=503, detail="busy")
    assert due_after([unavailable, unavailable, unavailable]) == [0, 1, 2]
    too_many = Outcome(ok=False, status=429, detail="slow down", throttled=True)
    assert due_after([too_many]) == [60]
