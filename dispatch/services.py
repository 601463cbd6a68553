"""Services of the delivery engine that other apps call, and what its stages share: the stats
hash, the fan-out's lease and the fenced lease scripts.

The stages have their own modules, in the order a notification meets them: `accept` (web),
`fanout`, `pump` with `deliver` (workers), `sweeps` (beat).
"""

from __future__ import annotations

import logging

from dispatch import flow
from dispatch.models import ConsumerLimit
from hpwsn_site import state

log = logging.getLogger(__name__)

STATS = state.PREFIX + "stats"
FANOUT_LEASE = state.PREFIX + "fanout:lease"

# Release a lease only if we still own it (a lease that expired may belong to another pump now).
RELEASE = state.Script("""
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
""")
# Renew a lease for ARGV[2] ms only if ARGV[1] still holds it; 1 if renewed, else 0.
RENEW = state.Script("""
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0
""")

# The attempts at an ordered queue's head batch (KEYS[1]), each recording the batch's first item


def consumer_limit_set(*, consumer: str, window: int | None, rate: float | None) -> None:
    """Set (or with both None, remove) one consumer's flow-control limits; every worker reloads."""
    key = flow.consumer_of(consumer)
    if window is None and rate is None:
        ConsumerLimit.objects.filter(consumer=key).delete()
    else:
        ConsumerLimit.objects.update_or_create(
            consumer=key, defaults={"window": window, "rate": rate}
        )
    state.bump(state.VERSION_LIMITS)
