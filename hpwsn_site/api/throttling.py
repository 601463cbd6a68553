"""Rate limits of /api/v1/ per principal (per address for anonymous callers), kept in Redis.

A fixed window per scope and caller: one INCR (and an EXPIRE on the first) per request, shared by
every web process. Over the limit the answer is 429 with Retry-After (the end of the window).
Rates: HPWSN_API_THROTTLE_<SCOPE> as "<count>/<second|minute|hour>".
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from hpwsn_site import state
from hpwsn_site.api.auth import principal_of
from hpwsn_site.clients import request_client
from hpwsn_site.env import parse_rate


@dataclass(frozen=True, slots=True)
class Window:
    key: str
    limit: int
    period: int
    ends_at: float


def throttle_window(*, scope: str, ident: str, now: float) -> Window | None:
    """The counter a request of `ident` in `scope` counts in; None when the scope is unlimited."""
    rates: dict[str, str] = settings.HPWSN_API_THROTTLE
    limit, period = parse_rate(rates.get(scope) or rates["api"])
    if limit <= 0:
        return None
    window = int(now // period)
    key = state.api_throttle_key(scope, ident, window)
    return Window(key=key, limit=limit, period=period, ends_at=(window + 1) * period)


def _wait(w: Window, count: int, now: float) -> float | None:
    """None when allowed; else the whole seconds (>= 1) until the window ends."""
    return None if count <= w.limit else float(math.ceil(w.ends_at - now))


def throttle_hit(*, scope: str, ident: str) -> float | None:
    """Count one request; None when it is allowed, else seconds to wait."""
    now = time.time()
    w = throttle_window(scope=scope, ident=ident, now=now)
    if w is None:
        return None
    pipe = state.get_redis().pipeline(transaction=False)
    pipe.incr(w.key)
    pipe.expire(w.key, w.period + 1, nx=True)
    return _wait(w, int(pipe.execute()[0]), now)


# The fast path counts in this process and adds its count to Redis at most every FLUSH_S (or
# every FLUSH_N requests, or at once near the limit): a Redis round trip per publish would cost
# as much as the publish's own. The shared count may lag by FLUSH_S per process; near the limit
# every request asks Redis, so the limit itself holds.
FLUSH_S = 0.1
FLUSH_N = 100


@dataclass(slots=True)
class _Local:
    shared: int = 0  # the window's count in Redis when last asked
    pending: int = 0  # counted here, not yet added to Redis
    flushed_at: float = -1e9  # time.monotonic()


_local: dict[str, _Local] = {}


async def throttle_hit_async(*, scope: str, ident: str) -> float | None:
    """throttle_hit for the ASGI fast path, with the count batched per process (above)."""
    now = time.time()
    w = throttle_window(scope=scope, ident=ident, now=now)
    if w is None:
        return None
    entry = _local.get(w.key)
    if entry is None:
        if len(_local) > 10_000:  # windows of the past, or very many callers
            _local.clear()
        entry = _local[w.key] = _Local()
    entry.pending += 1
    mono = time.monotonic()
    if (
        mono - entry.flushed_at >= FLUSH_S
        or entry.pending >= FLUSH_N
        or entry.shared + entry.pending > w.limit
    ):
        n, entry.pending, entry.flushed_at = entry.pending, 0, mono
        pipe = state.get_async_redis().pipeline(transaction=False)
        pipe.incrby(w.key, n)
        pipe.expire(w.key, w.period + 1, nx=True)
        entry.shared = int((await pipe.execute())[0])
    return _wait(w, entry.shared + entry.pending, now)


class PrincipalThrottle(BaseThrottle):
    """The view's `throttle_scope` (default `api`), per principal or client address."""

    def __init__(self) -> None:
        self.wait_s: float | None = None

    def allow_request(self, request: Request, view: Any) -> bool:
        principal = principal_of(request)
        ident = principal.name or f"anon@{self.get_ident(request)}"
        scope = getattr(view, "throttle_scope", None) or "api"
        self.wait_s = throttle_hit(scope=scope, ident=ident)
        return self.wait_s is None

    def get_ident(self, request: Request) -> str:
        return request_client(request.META)

    def wait(self) -> float | None:
        return self.wait_s
