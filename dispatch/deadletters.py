"""Operator actions on the dead-letter store: redrive (re-queue) letters to their subscriptions."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from dispatch.bodies import bodies_hold
from dispatch.models import DeadLetter
from dispatch.selectors import dead_letters
from dispatch.wake import pump_kick
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

    A redriven letter keeps its row (marked `redriven_at`) until its consumer has taken it: the
    pump deletes the row on delivery, or replaces it if the letter dies again, and a Redis loss
    re-queues it (`letters_requeue`). Letters of subscriptions that no longer exist, and letters
    already redriven, stay as they are (not counted).
    """
    with transaction.atomic():
        # Locked and skipped when locked: two redrives at once never queue a letter twice.
        letters = list(
            dead_letters(
                ids=ids, subscription_id=subscription_id, since=since, redriven=False
            ).select_for_update(skip_locked=True)
        )
        wanted = {u for letter in letters if (u := _uuid(letter.subscription_id)) is not None}
        alive = {
            str(i) for i in Subscription.objects.filter(id__in=wanted).values_list("id", flat=True)
        }
        letters = [letter for letter in letters if letter.subscription_id in alive]
        if not letters:
            return 0
        # The rows first, Redis second: if the transaction fails nothing was queued; if Redis
        # fails the transaction rolls back and the letters stay as they were.
        dead_letters(ids=[letter.id for letter in letters]).update(redriven_at=timezone.now())
        _queue(state.get_redis(), letters)
    for sub_id in sorted({letter.subscription_id for letter in letters}):
        pump_kick(subscription_id=sub_id)
    return len(letters)


def letters_requeue(r: Any) -> int:
    """After a Redis loss: queue every redriven letter not yet delivered again; returns how many."""
    alive = {str(i) for i in Subscription.objects.values_list("id", flat=True)}
    letters = [
        letter
        for letter in dead_letters(redriven=True).iterator()
        if letter.subscription_id in alive
    ]
    if letters:
        _queue(r, letters)
    return len(letters)


def _queue(r: Any, letters: list[DeadLetter]) -> None:
    pipe = r.pipeline(transaction=True)
    for letter in letters:
        pipe.rpush(state.queue_key(letter.subscription_id), letter.queue_item)
    ttl_ms = settings.HPWSN_MESSAGE_RETENTION_S * 1000
    bodies_hold(pipe, ((x.notification_id, 1, ttl_ms, bytes(x.message)) for x in letters))
    pipe.sadd(state.BUSY, *{letter.subscription_id for letter in letters})
    pipe.execute()


def dead_letters_delete(*, ids: Iterable[int]) -> int:
    """Drop dead letters for good (not redriven ones: their message is queued again); how many."""
    deleted, _by_model = dead_letters(ids=list(ids), redriven=False).delete()
    return int(deleted)
