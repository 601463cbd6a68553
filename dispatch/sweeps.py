"""Sweeps (beat): retries that are due, and the safety net for work whose task was lost."""

from __future__ import annotations

import logging
import time
from typing import Any

from django.core.exceptions import ValidationError

from dispatch.fanout import fanout_pending
from dispatch.ready import pumps_ready
from dispatch.services import FANOUT_LEASE, pump_kick
from hpwsn_site import state
from subscriptions.selectors import subscription_index

log = logging.getLogger(__name__)


def _forget(r: Any, sid: str) -> None:
    pipe = r.pipeline(transaction=False)
    state.subscription_forget(pipe, sid)
    pipe.execute()


def subscription_gone(sid: str) -> bool:
    """True if the subscription no longer exists; a process's index may not have a new one yet."""
    from subscriptions.models import Subscription

    try:
        return not Subscription.objects.filter(id=sid).exists()
    except (ValueError, ValidationError):  # not even an id
        return True


def retry_sweep() -> int:
    """Queue a pump for every subscription whose next attempt (or batch set aside) is due."""
    r = state.get_redis()
    kicked = 0
    now = time.time()
    for key in (state.RETRY, state.ASIDE_DUE):
        for raw in r.zrangebyscore(key, 0, now):
            if r.zrem(key, raw):
                pumps_ready(r, [raw.decode()])
                kicked += 1
    return kicked


def stall_sweep() -> int:
    """Safety net: restart work whose task was lost (a killed worker), and free orphan queues."""
    r = state.get_redis()
    kicked = 0
    if fanout_pending(r) and not r.exists(FANOUT_LEASE):
        from dispatch.tasks import fanout

        r.set(state.FANOUT_SCHED, "1", ex=60)
        fanout.delay()
        kicked += 1
    index = subscription_index()
    for raw in r.smembers(state.BUSY):
        sid = raw.decode()
        entry = index.by_id.get(sid)
        if entry is None:
            if subscription_gone(sid):
                _forget(r, sid)
            continue  # the checkpoint takes it out of the set once gone
        if entry.mode != "push" or entry.paused:
            continue
        if r.exists(state.lease_key(sid)) or r.zscore(state.RETRY, sid) is not None:
            continue
        if not r.exists(*state.queue_keys(sid)):
            continue
        pump_kick(subscription_id=sid)
        kicked += 1
    return kicked
