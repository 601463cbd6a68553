"""Reads of the dispatch app: the dead-letter store."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db.models import QuerySet

from dispatch.models import DeadLetter


def dead_letters(
    *,
    ids: Iterable[int] | None = None,
    subscription_id: str | None = None,
    since: datetime | None = None,
) -> QuerySet[DeadLetter]:
    """Dead letters, oldest first, narrowed by id, subscription and creation time."""
    qs = DeadLetter.objects.order_by("id")
    if ids is not None:
        qs = qs.filter(id__in=list(ids))
    if subscription_id:
        qs = qs.filter(subscription_id=subscription_id)
    if since is not None:
        qs = qs.filter(created_at__gte=since)
    return qs
