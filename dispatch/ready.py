"""The ready list: subscriptions whose pump should run now.

Whatever finds work for a pump (the fan-out, the retry sweeper, a redrive, a resume, a wake-up)
appends the subscription to one Redis list, `state.READY`; the pump loops of the workers
(dispatch/pumploop.py) take from it. Waking ten thousand subscriptions is one RPUSH (and one
HSET of their scheduled marks).

An id may be there twice, or be taken by a loop that then finds the lease held: the lease decides
who drains a queue, and its holder looks at the queue again before it lets go. An id lost with a
killed worker is found again by the stall sweep (its queue is busy, no lease holds it).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from hpwsn_site import state


def pumps_ready(r: Any, sub_ids: Iterable[str]) -> int:
    """Append these subscriptions to the ready list (on a client or a pipeline); how many.

    Their scheduled marks (`state.SCHED`) get the time: the stall sweep takes a mark older than
    its grace, with no pump holding the lease, for a pump that was lost."""
    ids = list(sub_ids)
    if ids:
        r.hset(state.SCHED, mapping=dict.fromkeys(ids, repr(time.time())))
        r.rpush(state.READY, *ids)
    return len(ids)
