"""The checkpoint of reliable topics and the recovery after a Redis loss, against a Redis of the
test's own (a loss is a flush, which the shared one must never see)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from dispatch import reliable
from dispatch.models import DeliveryCursor
from hpwsn_site import state


def _subscription() -> str:
    from subscriptions.models import Subscription
    from subscriptions.selectors import subscription_index

    sub = Subscription.objects.create(
        consumer_address="http://127.0.0.1:9/consumer",
        topic_expression="ALL",
        topic_dialect="http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple",
        topic_path="ALL",
        dedup_key=uuid.uuid4().hex,
    )
    state.bump(state.VERSION_SUBS)
    subscription_index()  # this process's index sees it now, not up to a second later
    return str(sub.id)


def _subscriptions(count: int) -> list[str]:
    """Many subscriptions at once, in this process's index."""
    from subscriptions.models import Subscription
    from subscriptions.selectors import subscription_index

    made = Subscription.objects.bulk_create(
        Subscription(
            consumer_address=f"http://127.0.0.1:9/c{i}",
            topic_expression="ALL",
            topic_dialect="http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple",
            topic_path="ALL",
            dedup_key=uuid.uuid4().hex,
        )
        for i in range(count)
    )
    state.bump(state.VERSION_SUBS)
    subscription_index()
    return [str(s.id) for s in made]


def _cursors() -> dict[str, int]:
    return dict(DeliveryCursor.objects.values_list("name", "seq"))


def _at(r, position: int) -> None:  # type: ignore[no-untyped-def]
    r.set(state.EPOCH, repr(time.time()))
    r.set(state.FANOUT_SEQ, position)


def test_idle_subscriptions_leave_the_busy_set_and_only_lagging_ones_get_a_cursor(db, own_redis):
    r = own_redis
    idle, lagging = _subscription(), _subscription()
    _at(r, 20)
    r.rpush(state.queue_key(lagging), b"n1|r15", b"n2|r16")
    r.sadd(state.BUSY, idle, lagging)

    reliable.checkpoint_run()

    assert r.smembers(state.BUSY) == {lagging.encode()}
    assert _cursors() == {"fanout": 20, f"sub:{lagging}": 14}

    r.delete(*state.queue_keys(lagging))  # pushed
    reliable.checkpoint_run()

    assert r.smembers(state.BUSY) == set()
    assert _cursors() == {"fanout": 20}


def test_a_redriven_letter_at_the_head_keeps_the_messages_behind_it_replayable(db, own_redis):
    r = own_redis
    sub = _subscription()
    _at(r, 10)
    reliable.checkpoint_run()  # idle: no cursor of its own, at 10
    # A redriven letter, then two messages accepted after the checkpoint.
    r.rpush(state.queue_key(sub), b"old|d7", b"n11|r11", b"n12|r12")
    r.sadd(state.BUSY, sub)
    r.set(state.FANOUT_SEQ, 12)

    reliable.checkpoint_run()

    assert _cursors() == {"fanout": 12, f"sub:{sub}": 10}

    r.flushdb()  # Redis loses everything
    assert reliable.recover()

    assert int(r.get(state.FANOUT_SEQ)) == 10
    replay = {k.decode(): int(v) for k, v in r.hgetall(state.REPLAY).items()}
    # This subscription is replayed from 10 (it gets 11 and 12 again); every other one from 12.
    assert replay == {sub: 10, "_rest": 12, "_until": 12}


def test_batches_set_aside_hold_the_watermark_whatever_their_order(db, own_redis):
    r = own_redis
    sub = _subscription()
    _at(r, 30)
    # Set aside in the order their pushes failed, not in sequence order.
    aside = {
        json.dumps({"items": ["a|r25"], "attempts": []}): 1.0,
        json.dumps({"items": ["b|r21", "c|r22"], "attempts": []}): 2.0,
    }
    r.zadd(state.aside_key(sub), aside)
    r.sadd(state.BUSY, sub)

    reliable.checkpoint_run()

    assert _cursors() == {"fanout": 30, f"sub:{sub}": 20}
    assert r.smembers(state.BUSY) == {sub.encode()}


def test_a_checkpoint_writes_only_the_cursors_that_moved(db, own_redis):
    r = own_redis
    still, moving, done = _subscription(), _subscription(), _subscription()
    _at(r, 20)
    r.rpush(state.queue_key(still), b"n1|r11")
    r.rpush(state.queue_key(moving), b"n2|r12", b"n3|r13")
    r.rpush(state.queue_key(done), b"n4|r14")
    r.sadd(state.BUSY, still, moving, done)
    reliable.checkpoint_run()
    assert _cursors() == {"fanout": 20, f"sub:{still}": 10, f"sub:{moving}": 11, f"sub:{done}": 13}
    written = dict(DeliveryCursor.objects.values_list("name", "updated_at"))

    r.lpop(state.queue_key(moving))  # delivered: its watermark moves
    r.delete(state.queue_key(done))  # caught up: its cursor goes
    reliable.checkpoint_run()

    assert _cursors() == {"fanout": 20, f"sub:{still}": 10, f"sub:{moving}": 12}
    again = dict(DeliveryCursor.objects.values_list("name", "updated_at"))
    assert again[f"sub:{still}"] == written[f"sub:{still}"]  # not written again
    assert again[f"sub:{moving}"] > written[f"sub:{moving}"]
    assert again["fanout"] > written["fanout"]


_SHRINK = """
import os, sys, time
import django
django.setup()
from dispatch import reliable
from dispatch.models import StoredMessage
from hpwsn_site import state

def size():
    return sum(os.path.getsize(os.path.join(d, f)) for d in [os.environ["HPWSN_DATA_DIR"]]
               for f in os.listdir(d) if f.startswith("hpwsn.sqlite3"))

empty = size()
old = time.time() - 3600  # past the dedup window
StoredMessage.objects.bulk_create(
    StoredMessage(notification_id=f"n{i}", topic_path="ALL", payload=os.urandom(1500),
                  accepted_at=old)
    for i in range(20_000)
)
full = size()
r = state.get_redis()
r.set(state.EPOCH, repr(time.time()))
r.set(state.FANOUT_SEQ, 20_000)  # fanned out, and no subscription lags
deleted = reliable.checkpoint_run()
print(empty, full, size(), deleted, StoredMessage.objects.count())
"""


def test_the_embedded_database_gives_back_the_space_of_the_pruned_log(own_redis, tmp_path):
    """On SQLite (the default) the file shrinks once the checkpoint has pruned the log: a burst
    of traffic does not leave the database at its largest size for good."""
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "hpwsn_site.settings",
        "HPWSN_DATA_DIR": str(tmp_path),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'hpwsn.sqlite3'}",
        "REDIS_URL": f"redis://127.0.0.1:{own_redis.connection_pool.connection_kwargs['port']}/0",
        "HPWSN_EVENTS": "0",
    }
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"], cwd=root, env=env, check=True,
        capture_output=True,
    )  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-c", _SHRINK], cwd=root, env=env, check=True, capture_output=True,
        text=True,
    ).stdout.split()  # fmt: skip
    empty, full, after, deleted, left = map(int, out[-5:])
    assert deleted == 20_000
    assert left == 0
    assert full > empty + 30_000_000  # 20,000 rows of 1.5 KB
    assert after < empty + 2_000_000  # back to about where it started, write-ahead log included


def test_a_message_queued_at_another_priority_holds_the_subscriptions_watermark(db, own_redis):
    """The checkpoint reads a busy subscription's default queue and the other priorities the
    fan-out recorded for it, not all ten: what waits at priority 9 still holds the log."""
    from dispatch import fanout

    r = own_redis
    sub = _subscription()
    _at(r, 20)
    r.hset(state.PRIOS, "*", "1")  # this Redis was filled by a fan-out that records priorities
    fanout.queues_push(r, {(sub, 9): [b"n1|r15"], (sub, 4): [b"n2|r17"]}, set())
    assert r.hget(state.PRIOS, sub) == b"9"

    reliable.checkpoint_run()

    assert _cursors()[f"sub:{sub}"] == 14
    r.delete(*state.queue_keys(sub))  # delivered
    reliable.checkpoint_run()
    assert r.hget(state.PRIOS, sub) is None
    assert r.smembers(state.BUSY) == set()


def test_a_redis_filled_before_priorities_were_recorded_gets_one_full_look(db, own_redis):
    r = own_redis
    sub = _subscription()
    _at(r, 20)
    r.rpush(state.queue_key(sub, 7), b"n1|r12")  # queued by a version that did not record it
    r.sadd(state.BUSY, sub)

    reliable.checkpoint_run()

    assert _cursors()[f"sub:{sub}"] == 11
    assert r.hget(state.PRIOS, sub) == b"7"
    assert r.hget(state.PRIOS, "*") == b"1"  # from now on the fan-out's record is trusted


def test_thousands_of_busy_subscriptions_are_measured_a_thousand_at_a_time(db, own_redis):
    # One script over ten thousand subscriptions would hold Redis for tens of milliseconds
    # every second: every pump would wait behind it.
    r = own_redis
    sids = _subscriptions(2_500)
    _at(r, 5_000)
    for i, sid in enumerate(sids):
        r.rpush(state.queue_key(sid), f"n{i}|r{i + 1}".encode())
    r.sadd(state.BUSY, *sids)
    r.config_resetstat()

    reliable.checkpoint_run()

    assert r.info("commandstats")["cmdstat_eval"]["calls"] == 3
    assert _cursors() == {"fanout": 5_000, **{f"sub:{sid}": i for i, sid in enumerate(sids)}}
    assert r.hget(state.PRIOS, "*") == b"1"  # the full look was done once, over all of them
