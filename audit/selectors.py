"""Reads of the audit log."""

from __future__ import annotations

from django.db.models import Q, QuerySet

from audit.models import AuditEntry


def audit_entries(
    *, actor: str = "", object_query: str = "", object_type: str = ""
) -> QuerySet[AuditEntry]:
    """Entries, newest first, narrowed by user name, object id/path (substring) and type."""
    qs = AuditEntry.objects.all()
    if actor:
        qs = qs.filter(actor__iexact=actor.strip())
    if object_query:
        text = object_query.strip()
        # A topic's entries are found by its path as it was, or by any path it was renamed to.
        qs = qs.filter(
            Q(object_id__icontains=text)
            | Q(after__path__icontains=text)
            | Q(before__path__icontains=text)
        )
    if object_type:
        qs = qs.filter(object_type=object_type)
    return qs


def topic_audit_entries(*, topic_id: int) -> QuerySet[AuditEntry]:
    """One topic's entries, newest first, under every path it had (its snapshots carry its id)."""
    return AuditEntry.objects.filter(object_type="topic").filter(
        Q(before__id=topic_id) | Q(after__id=topic_id)
    )


def audit_actors() -> list[str]:
    """Every user name that appears in the log, for the filter's choices."""
    return list(AuditEntry.objects.order_by("actor").values_list("actor", flat=True).distinct())
