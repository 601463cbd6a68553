"""Rate limits of /api/v1/ per principal (per address for anonymous callers), kept in Redis.

A fixed window per scope and caller: one INCR (and an EXPIRE on the first) per request, shared by
every web process. Over the limit the answer is 429 with Retry-After (the end of the window).
Rates: HPWSN_API_THROTTLE_<SCOPE> as "<count>/<second|minute|hour>".
"""

from __future__ import annotations

import math
import time
from typing import Any

from django.conf import settings
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from hpwsn_site import state
from hpwsn_site.api.auth import principal_of

_PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_rate(rate: str) -> tuple[int, int]:
    """'600/minute' -> (600, 60)."""
    count, _sep, period = rate.partition("/")
    return int(count), _PERIODS[period.strip()[:1]]


class PrincipalThrottle(BaseThrottle):
    """The view's `throttle_scope` (default `api`), per principal or client address."""

    def __init__(self) -> None:
        self.wait_s: float | None = None

    def allow_request(self, request: Request, view: Any) -> bool:
        scope = getattr(view, "throttle_scope", None) or "api"
        rates: dict[str, str] = settings.HPWSN_API_THROTTLE
        rate = rates.get(scope) or rates["api"]
        limit, period = parse_rate(rate)
        if limit <= 0:
            return True
        principal = principal_of(request)
        ident = principal.name or f"anon@{self.get_ident(request)}"
        now = time.time()
        window = int(now // period)
        key = state.api_throttle_key(scope, ident, window)
        pipe = state.get_redis().pipeline(transaction=False)
        pipe.incr(key)
        pipe.expire(key, period + 1, nx=True)
        count = int(pipe.execute()[0])
        if count <= limit:
            return True
        self.wait_s = float(math.ceil((window + 1) * period - now))  # whole seconds, >= 1
        return False

    def wait(self) -> float | None:
        return self.wait_s
