"""Notification ids that carry their accept time, so any stage can tell how old a message is.

`<12 hex: accept time in ms><20 hex: random>`: 32 hex characters like the uuid4 hex ids before
them, sortable by accept time, and unique by 80 random bits per millisecond.
"""

from __future__ import annotations

import os
import time

# A plausible accept time: after 2020-01-01 and not from the future (ids of the older uuid4
# format decode to a random time, almost always outside this window).
_EARLIEST_MS = 1_577_836_800_000
_FUTURE_SLACK_MS = 24 * 3600 * 1000


def notification_id_new(now: float) -> str:
    """A new id accepted at `now` (epoch seconds)."""
    return f"{int(now * 1000):012x}{os.urandom(10).hex()}"


def notification_id_time(nid: str | bytes) -> float | None:
    """The accept time (epoch seconds) of an id, or None when it carries none."""
    # Called for every delivered message: int() parses bytes and str alike, no decode needed.
    if len(nid) != 32:
        return None
    try:
        ms = int(nid[:12], 16)
    except ValueError:
        return None
    if ms < _EARLIEST_MS or ms > time.time() * 1000 + _FUTURE_SLACK_MS:
        return None
    return ms / 1000.0
