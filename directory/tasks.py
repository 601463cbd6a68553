"""Celery edges of the directory synchronisation."""

from __future__ import annotations

from celery import shared_task

# The services import late: directory/outbox.py imports this module to queue the flush.


@shared_task(acks_late=True)
def outbox_flush() -> int:
    """Write queued subscription changes to the directory (safe to run twice: rows are claimed
    by a lock and removed only when unchanged since read)."""
    from directory.services import outbox_flush as flush

    return flush()
