"""Queueing directory writes: the outbox rows the services record and the flush that follows.

Subscription and registration services call these inside their own transaction, so a change and
its outbox row commit together; `directory.services.outbox_flush` writes them to the directory
later. Kept apart from the services so the subscription and registration modules depend on this
small piece only, not on the whole synchronisation.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from directory import tasks
from directory.ldapconn import directory_configured
from directory.models import OutboxWrite, RegistrationWrite, SubscriptionWrite
from hpwsn_site import state

log = logging.getLogger("directory")

FLUSH_SCHED = state.PREFIX + "dir:flush:sched"


def subscription_directory_write(*, subscription_ids: Iterable[Any]) -> None:
    """Queue the directory write of these subscriptions (their latest state, or their removal).

    Called at the end of every subscription service; a no-op without a directory. It never fails
    the SOAP operation that called it: a queueing error is logged, and reconcile repairs it.
    """
    _queue(SubscriptionWrite, "subscription_id", subscription_ids)


def registration_directory_write(*, registration_ids: Iterable[Any]) -> None:
    """Queue the directory write of these publisher registrations (latest state, or removal).

    Called inside the transaction of every registration service that makes, renews or removes
    one; a no-op without a directory, and never fails the operation that called it.
    """
    _queue(RegistrationWrite, "registration_id", registration_ids)


def _queue(model: type[OutboxWrite], key_field: str, ids: Iterable[Any]) -> None:
    if not directory_configured():
        return
    ids = list(ids)
    try:
        keys = [uuid.UUID(str(i)) for i in ids]
        # A savepoint: a failed queueing must not poison the caller's transaction.
        with transaction.atomic():
            _queue_writes(model, key_field, keys)
    except Exception:
        log.exception("directory: could not queue the directory write of %s", ids)
        return
    transaction.on_commit(_kick_flush)


def _queue_writes(model: type[OutboxWrite], key_field: str, keys: list[uuid.UUID]) -> None:
    now = timezone.now()
    manager = model._default_manager
    for key in keys:
        bump = {"version": F("version") + 1, "next_try_at": now, "attempts": 0}
        if manager.filter(**{key_field: key}).update(**bump):
            continue
        try:
            with transaction.atomic():
                manager.create(**{key_field: key, "next_try_at": now})
        except IntegrityError:  # a concurrent call queued it first
            manager.filter(**{key_field: key}).update(**bump)


def _kick_flush() -> None:
    # At most one flush queued at a time; beat flushes every 2 s anyway.
    try:
        if state.get_redis().set(FLUSH_SCHED, 1, nx=True, ex=5):
            tasks.outbox_flush.delay()
    except Exception:  # the periodic flush catches up
        log.warning("directory: could not queue the outbox flush", exc_info=True)
