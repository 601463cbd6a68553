"""Flow control per consumer: a window of messages in flight and a rate limit (seeds 004).

A consumer is its scheme://host:port, shared by all its subscriptions, so ten subscriptions of one
slow endpoint cannot together flood it. Both limits live in Redis, so every worker process sees
the same figures; each grant expires, so a worker killed in the middle of a push frees its share.
"""

from __future__ import annotations

import time
import uuid
from typing import Any
from urllib.parse import urlsplit

from hpwsn_site import state

# Window: a sorted set of grants "<token>:<n>" scored by their expiry. A grant is given when the
# messages in flight plus n fit the window, or when nothing is in flight (a batch larger than the
# window still goes, alone).
_ACQUIRE = state.Script("""
local now = tonumber(ARGV[1])
redis.call('zremrangebyscore', KEYS[1], '-inf', now)
local inflight = 0
for _, member in ipairs(redis.call('zrange', KEYS[1], 0, -1)) do
  inflight = inflight + tonumber(string.match(member, ':(%d+)$'))
end
local n = tonumber(ARGV[4])
if inflight > 0 and inflight + n > tonumber(ARGV[2]) then return 0 end
redis.call('zadd', KEYS[1], now + tonumber(ARGV[3]), ARGV[5] .. ':' .. ARGV[4])
redis.call('pexpire', KEYS[1], math.ceil(tonumber(ARGV[3]) * 1000))
return 1
""")

# Rate: a token bucket (tokens, time) refilled at `rate` per second up to `burst`. Returns the
# seconds to wait before n messages may go (0: they may go now, and the tokens are taken).
_RATE = state.Script("""
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local now, n = tonumber(ARGV[3]), tonumber(ARGV[4])
local b = redis.call('hmget', KEYS[1], 'tokens', 'time')
local tokens = tonumber(b[1]) or burst
local last = tonumber(b[2]) or now
tokens = math.min(burst, tokens + (now - last) * rate)
local need = math.min(n, burst)
if tokens < need then
  return tostring((need - tokens) / rate)
end
redis.call('hset', KEYS[1], 'tokens', tostring(tokens - n), 'time', tostring(now))
redis.call('expire', KEYS[1], math.ceil(burst / rate) + 60)
return '0'
""")


def consumer_of(address: str) -> str:
    """scheme://host:port of a consumer address: the unit flow control counts per."""
    parts = urlsplit(address)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{parts.hostname}:{port}"


def window_key(consumer: str) -> str:
    return f"{state.PREFIX}win:{consumer}"


def rate_key(consumer: str) -> str:
    return f"{state.PREFIX}rate:{consumer}"


def window_acquire(r: Any, *, consumer: str, n: int, window: int, hold_s: float) -> str | None:
    """A grant for n messages in flight to the consumer, or None when its window is full."""
    if window <= 0:
        return ""
    token = uuid.uuid4().hex
    granted = _ACQUIRE(r, 1, window_key(consumer), time.time(), window, hold_s, n, token)
    return f"{token}:{n}" if granted else None


def window_release(r: Any, *, consumer: str, grant: str) -> None:
    if grant:
        r.zrem(window_key(consumer), grant)


def rate_wait(r: Any, *, consumer: str, n: int, rate: float) -> float:
    """Seconds until n messages may go to the consumer (0: now; their tokens are taken)."""
    if rate <= 0:
        return 0.0
    burst = max(rate, 1.0)  # up to one second's worth at once
    return float(_RATE(r, 1, rate_key(consumer), rate, burst, time.time(), n))
