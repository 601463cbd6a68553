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
from typing import Any, cast

from django.db import transaction
from django.db.models import Field
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
        if transaction.get_connection().in_atomic_block:
            # A savepoint: a failed queueing must not poison the caller's transaction.
            with transaction.atomic():
                _queue_writes(model, key_field, keys)
        else:
            _queue_writes(model, key_field, keys)
    except Exception:
        log.exception("directory: could not queue the directory write of %s", ids)
        return
    transaction.on_commit(_kick_flush)


def _queue_writes(model: type[OutboxWrite], key_field: str, keys: list[uuid.UUID]) -> None:
    """One upsert per object: a new row, or the pending one bumped (a newer version, due now)."""
    now = timezone.now()
    connection = transaction.get_connection()
    quote = connection.ops.quote_name
    meta = model._meta
    values = {
        "version": 1,
        "attempts": 0,
        "next_try_at": now,
        "last_error": "",
        "created_at": now,
        "updated_at": now,
    }
    columns = [key_field, *values]
    # Concrete columns of the model (no relations among them).
    fields = {c: cast("Field[Any, Any]", meta.get_field(c)) for c in columns}
    table = quote(meta.db_table)
    # Names from the model and placeholders only: every value goes as a parameter.
    sql = (
        f"INSERT INTO {table} ({', '.join(quote(fields[c].column) for c in columns)})"  # noqa: S608
        f" VALUES ({', '.join(['%s'] * len(columns))})"
        f" ON CONFLICT ({quote(fields[key_field].column)}) DO UPDATE SET"
        f" version = {table}.version + 1, attempts = 0,"
        " next_try_at = excluded.next_try_at, updated_at = excluded.updated_at"
    )
    with connection.cursor() as cursor:
        for key in keys:
            row = {key_field: key, **values}
            cursor.execute(
                sql,
                [fields[c].get_db_prep_value(row[c], connection) for c in columns],
            )


def _kick_flush() -> None:
    # At most one flush queued at a time; beat flushes every 2 s anyway.
    try:
        if state.get_redis().set(FLUSH_SCHED, 1, nx=True, ex=5):
            tasks.outbox_flush.delay()
    except Exception:  # the periodic flush catches up
        log.warning("directory: could not queue the outbox flush", exc_info=True)
