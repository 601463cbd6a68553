"""Operator actions on the dead-letter store: redrive (re-queue) letters to their subscriptions."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime

from django.conf import settings
from django.db import transaction

from dispatch.selectors import dead_letters
from hpwsn_site import state
from subscriptions.models import Subscription


def _uuid(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


def dead_letters_redrive(
    *,
    ids: Iterable[int] | None = None,
    subscription_id: str | None = None,
    since: datetime | None = None,
) -> int:
    """Re-queue dead letters at the tail of their subscription's queue; returns how many.

    Letters of subscriptions that no longer exist stay in the store (not counted).
    """
    with transaction.atomic():
        # Locked and skipped when locked: two redrives at once never queue a letter twice.
        letters = list(
            dead_letters(ids=ids, subscription_id=subscription_id, since=since).select_for_update(
                skip_locked=True
            )
        )
        wanted = {u for letter in letters if (u := _uuid(letter.subscription_id)) is not None}
        alive = {
            str(i) for i in Subscription.objects.filter(id__in=wanted).values_list("id", flat=True)
        }
        letters = [letter for letter in letters if letter.subscription_id in alive]
        if not letters:
            return 0
        r = state.get_redis()
        pipe = r.pipeline(transaction=True)
        for letter in letters:
            pipe.set(
                state.payload_key(letter.notification_id),
                bytes(letter.message),
                ex=settings.HPWSN_MESSAGE_RETENTION_S,
            )
            pipe.rpush(state.queue_key(letter.subscription_id), letter.notification_id)
        pipe.execute()
        # Redis first, rows second: a crash in between delivers a letter twice, never loses it.
        dead_letters(ids=[letter.id for letter in letters]).delete()
    from dispatch.services import pump_kick

    for sub_id in sorted({letter.subscription_id for letter in letters}):
        pump_kick(subscription_id=sub_id)
    return len(letters)
