"""The dashboard's queue table: depths summed over a subscription's priority queues, read for
the busy subscriptions only and in one script per thousand, however many subscriptions exist."""

from __future__ import annotations

from dataclasses import replace

from hpwsn_site import state
from monitoring.selectors import queue_depths
from subscriptions.selectors import resource_tag
from tests.dispatch.conftest import own_redis  # noqa: F401 (fixture)
from tests.dispatch.test_checkpoint import _subscription


def test_depths_sum_the_priorities_of_the_busy_subscriptions_only(db, own_redis):  # noqa: F811
    r = own_redis
    deep, shallow, idle = _subscription(), _subscription(), _subscription()
    r.rpush(state.queue_key(deep, 9), b"a|f0", b"b|f0")
    r.rpush(state.queue_key(deep, 0), b"c|f0")
    r.rpush(state.queue_key(shallow, 4), b"d|f0")
    r.sadd(state.BUSY, deep, shallow)
    r.config_resetstat()

    found = queue_depths()

    assert found["subscriptions"] == 3
    assert found["subscription_messages"] == 4
    assert [(row["subscription"], row["depth"]) for row in found["deepest"]] == [
        (resource_tag(deep), 3),
        (resource_tag(shallow), 1),
    ]
    stats = r.info("commandstats")
    assert stats["cmdstat_eval"]["calls"] == 1
    # The Celery and ingest lists, and the ten queues of each busy subscription (this Redis holds
    # no record of the priorities queued): not the idle one's.
    assert stats["cmdstat_llen"]["calls"] == 2 + 2 * 10
    assert resource_tag(idle) not in {row["subscription"] for row in found["deepest"]}


def test_depths_read_the_priorities_the_fan_out_recorded(db, own_redis):  # noqa: F811
    r = own_redis
    deep, shallow = _subscription(), _subscription()
    r.rpush(state.queue_key(deep, 9), b"a|f0", b"b|f0")
    r.rpush(state.queue_key(deep, state.DEFAULT_PRIORITY), b"c|f0")
    r.rpush(state.queue_key(shallow, state.DEFAULT_PRIORITY), b"d|f0")
    r.sadd(state.BUSY, deep, shallow)
    r.hset(state.PRIOS, mapping={"*": "1", deep: "9"})
    r.config_resetstat()

    found = queue_depths()

    assert [row["depth"] for row in found["deepest"]] == [3, 1]
    # The Celery and ingest lists, the default queue of each, and the 9 of the deep one.
    assert r.info("commandstats")["cmdstat_llen"]["calls"] == 2 + 2 + 1


def test_the_snapshot_measures_again_only_after_its_share_of_time(db, own_redis, monkeypatch):  # noqa: F811
    # Ten thousand busy subscriptions cost tens of milliseconds a measure: the snapshot, every
    # second, spends at most a share of the process's time on them and shows the last measure
    # in between.
    from monitoring import selectors

    monkeypatch.setattr(selectors, "_measured", None)
    r = own_redis
    sid = _subscription()
    r.rpush(state.queue_key(sid), b"a|f0")
    r.sadd(state.BUSY, sid)
    assert selectors.subscription_depths(top=10, share=0.5).messages == 1
    r.rpush(state.queue_key(sid), b"b|f0")
    held = selectors._measured = replace(selectors._measured, cost=60.0)  # as if it took a minute

    # Within twice its cost: the same measure.
    assert selectors.subscription_depths(top=10, share=0.5) is held
    # Asked without a share, or for more rows than it holds: measured again.
    assert selectors.subscription_depths(top=10).messages == 2
    selectors._measured = held
    assert selectors.subscription_depths(top=50, share=0.5).messages == 2
    # Once the time since it covers its cost: measured again.
    selectors._measured = replace(held, at=held.at - 121.0)
    assert selectors.subscription_depths(top=10, share=0.5).messages == 2
