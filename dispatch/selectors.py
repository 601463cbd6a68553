"""Reads of the dispatch app: the dead-letter store, flow-control limits per consumer."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db.models import QuerySet

from dispatch.models import ConsumerLimit, DeadLetter
from hpwsn_site import state


@dataclass(frozen=True, slots=True)
class Limits:
    window: int  # messages in flight at once; 0: unlimited
    rate: float  # messages per second; 0: unlimited


def _load_limits() -> dict[str, tuple[int | None, float | None]]:
    rows = ConsumerLimit.objects.values_list("consumer", "window", "rate")
    return {consumer: (window, rate) for consumer, window, rate in rows}


_limits = state.VersionedCache(state.VERSION_LIMITS, _load_limits)


def _limits_of(rows: dict[str, tuple[int | None, float | None]], consumer: str) -> Limits:
    window, rate = rows.get(consumer, (None, None))
    return Limits(
        window=settings.HPWSN_CONSUMER_WINDOW if window is None else window,
        rate=settings.HPWSN_CONSUMER_RATE if rate is None else rate,
    )


def consumer_limits(*, consumer: str) -> Limits:
    """The flow-control limits of one consumer: its own row, else the broker's defaults."""
    return _limits_of(_limits.get(max_age=0.0), consumer)


def consumer_limits_cached(*, consumer: str) -> state.Cached[Limits] | None:
    """`consumer_limits` as this process last read them, without I/O, with the markers they
    reflect (None: nothing to trust, read them)."""
    cached = _limits.cached()
    if cached is None:
        return None
    return state.Cached(_limits_of(cached.value, consumer), cached.keys, cached.seen)


def dead_letters(
    *,
    ids: Iterable[int] | None = None,
    subscription_id: str | None = None,
    since: datetime | None = None,
    redriven: bool | None = None,
) -> QuerySet[DeadLetter]:
    """Dead letters, oldest first, narrowed by id, subscription, creation time and whether a
    redrive has queued them again (they stay until delivered)."""
    qs = DeadLetter.objects.order_by("id")
    if redriven is not None:
        qs = qs.filter(redriven_at__isnull=not redriven)
    if ids is not None:
        qs = qs.filter(id__in=list(ids))
    if subscription_id:
        qs = qs.filter(subscription_id=subscription_id)
    if since is not None:
        qs = qs.filter(created_at__gte=since)
    return qs
