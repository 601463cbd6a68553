"""Make a subscription's pump run: at once (`pump_kick`), or when it waits in retry back-off.

Both need only the Redis keys (hpwsn_site/state.py) and the ready set (dispatch/ready.py), so the
apps below dispatch (subscriptions) call them without importing the delivery engine.

`subscription_wake`: its consumer showed a sign of life.

A push that failed leaves the subscription in the retry zset (hpwsn_site.state.RETRY) until the
next step of its schedule, which may be hours away; an unordered subscription's failed batches
wait aside with their own due times. When the subscriber says its consumer is back (a duplicate
Subscribe), waiting any longer only delays messages: everything that waits becomes due now and
a pump is queued, as the retry sweeper would queue it when due. The batch keeps its attempts:
if it fails again, the schedule goes on from where it was (and so does the time to suspension).
"""

from __future__ import annotations

import time

from dispatch.ready import pumps_ready
from hpwsn_site import state

# KEYS: retry zset, the subscription's aside zset, the aside-due zset; ARGV: id, now.
# One script, so a pump that sets a batch aside meanwhile is either before or after it: a member
# it removed is not re-added (ZADD XX), one it adds later keeps its own due time.
_WAKE = """
local woke = 0
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then woke = 1 end
local waiting = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. ARGV[2], '+inf')
for _, member in ipairs(waiting) do
  redis.call('ZADD', KEYS[2], 'XX', ARGV[2], member)
  woke = 1
end
if redis.call('ZREM', KEYS[3], ARGV[1]) == 1 then woke = 1 end
return woke
"""


def pump_kick(*, subscription_id: str) -> None:
    """Make this subscription's pump run whether or not one is marked as scheduled."""
    pipe = state.get_redis().pipeline(transaction=False)
    pumps_ready(pipe, [subscription_id])
    pipe.execute()


def subscription_wake(*, subscription_id: str) -> bool:
    """Retry now what a subscription waits to retry; False when nothing was waiting."""
    sid = subscription_id
    woke = state.get_redis().eval(
        _WAKE, 3, state.RETRY, state.aside_key(sid), state.ASIDE_DUE, sid, repr(time.time())
    )
    if woke:
        pumps_ready(state.get_redis(), [sid])
    return bool(woke)
