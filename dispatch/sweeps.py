"""Sweeps (beat): retries that are due, and the safety net for work whose task was lost."""

from __future__ import annotations

import logging
import time
from typing import Any

from dispatch import tasks
from dispatch.fanout import fanout_pending
from dispatch.ready import pumps_ready
from dispatch.services import FANOUT_LEASE
from hpwsn_site import state
from subscriptions.selectors import subscription_gone, subscription_index

log = logging.getLogger(__name__)


def _forget(r: Any, sid: str) -> None:
    pipe = r.pipeline(transaction=False)
    state.subscription_forget(pipe, sid)
    pipe.execute()


def retry_sweep() -> int:
    """Queue a pump for every subscription whose next attempt (or batch set aside) is due: a
    few round trips, however many are due."""
    r = state.get_redis()
    now = time.time()
    due: dict[str, None] = {}
    for key in (state.RETRY, state.ASIDE_DUE):
        found = r.zrangebyscore(key, 0, now)
        if found:
            pipe = r.pipeline(transaction=False)
            for raw in found:
                pipe.zrem(key, raw)
            # Only those this sweep took off: another sweep may have taken the rest meanwhile.
            took = pipe.execute()
            due.update((raw.decode(), None) for raw, t in zip(found, took, strict=True) if t)
    pipe = r.pipeline(transaction=False)
    pumps_ready(pipe, due)
    pipe.execute()
    return len(due)


# A subscription scheduled this recently (its mark's time) is taken to be waiting on the ready
# list, not lost: kicked again, it would be pumped twice for nothing.
SCHEDULED_GRACE_S = 15.0
_CHUNK = 1000

# Of the subscriptions ARGV[4..] names, those a pump should be draining and none is: no lease
# (ARGV[1] .. id), no retry pending (in KEYS[1]), not scheduled after ARGV[3] (the time their
# mark in KEYS[2] holds: before that they are taken to wait on the ready list), and a queue not
# empty (ARGV[2] .. id .. ':' .. priority).
_STALLED = """
local lp, qp, cutoff = ARGV[1], ARGV[2], tonumber(ARGV[3])
local out = {}
for i = 4, #ARGV do
  local sid = ARGV[i]
  if redis.call('exists', lp .. sid) == 0 and not redis.call('zscore', KEYS[1], sid) then
    local mark = redis.call('hget', KEYS[2], sid)
    if not mark or (tonumber(mark) or 0) < cutoff then
      for p = 0, 9 do
        if redis.call('exists', qp .. sid .. ':' .. p) == 1 then
          out[#out + 1] = sid
          break
        end
      end
    end
  end
end
return out
"""


def stall_sweep() -> int:
    """Safety net: restart work whose task was lost (a killed worker), and free orphan queues.

    The Redis side of the check runs in one script per thousand subscriptions, not a round trip
    per subscription: ten thousand busy subscriptions cost a few calls every sweep.
    """
    r = state.get_redis()
    kicked = 0
    if fanout_pending(r) and not r.exists(FANOUT_LEASE):
        r.set(state.FANOUT_SCHED, "1", ex=60)
        tasks.fanout.delay()
        kicked += 1
    index = subscription_index()
    pushed: list[str] = []
    for raw in r.smembers(state.BUSY):
        sid = raw.decode()
        entry = index.by_id.get(sid)
        if entry is None:
            if subscription_gone(sid):
                _forget(r, sid)
            continue  # the checkpoint takes it out of the set once gone
        if entry.mode == "push" and not entry.paused:
            pushed.append(sid)
    # Ten thousand busy subscriptions behind slow consumers make a ready list that can take
    # longer than the grace to go round: an id still on it waits for a pump, it is not lost
    # (restarted, it would be pumped twice, and the list grow longer still). Read before the
    # marks: an id taken off the list after this has had its mark stamped (dispatch/pumploop.py).
    waiting = {raw.decode() for raw in r.lrange(state.READY, 0, -1)} if pushed else set()
    pushed = [sid for sid in pushed if sid not in waiting]
    cutoff = time.time() - SCHEDULED_GRACE_S
    prefixes = (state.lease_key(""), state.QUEUE_PREFIX, cutoff)
    stalled: list[str] = []
    for i in range(0, len(pushed), _CHUNK):
        found = r.eval(_STALLED, 2, state.RETRY, state.SCHED, *prefixes, *pushed[i : i + _CHUNK])
        stalled += [raw.decode() for raw in found]
    if stalled:  # as pump_kick does, for all of them at once
        # Work no pump was scheduled for: a worker died with it, or a wake-up was lost. Either
        # shows as a delay of seconds at the consumer; this says which subscriptions it was.
        log.warning(
            "stall sweep: %d subscription(s) had messages queued and no pump: %s",
            len(stalled),
            ", ".join(stalled[:10]) + (" …" if len(stalled) > 10 else ""),
        )
        pipe = r.pipeline(transaction=False)
        pumps_ready(pipe, stalled)
        pipe.execute()
    return kicked + len(stalled)
