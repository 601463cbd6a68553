"""Writes to the audit log."""

from __future__ import annotations

from typing import Any, Protocol

from audit.models import AuditEntry


class Actor(Protocol):
    """Whoever made a change: a Django user (local or mirrored from LDAP)."""

    def get_username(self) -> str: ...


def actor_name(actor: Actor | str) -> str:
    """The name recorded for an actor (a user, or a name such as a management command's)."""
    return actor if isinstance(actor, str) else actor.get_username()


def audit_record(
    *,
    actor: Actor | str,
    action: str,
    object_type: str,
    object_id: str,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> AuditEntry:
    """Record one change; call it inside the transaction of the change so both commit or neither."""
    return AuditEntry.objects.create(
        actor=actor_name(actor),
        action=action,
        object_type=object_type,
        object_id=object_id[:1024],
        before=before,
        after=after,
    )
