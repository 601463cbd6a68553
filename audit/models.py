from __future__ import annotations

from django.db import models
from django.utils import timezone


class AuditEntry(models.Model):
    """One change made by an operator: who, when, what, and the object before and after it."""

    # A user name, not a foreign key: the entry outlives the account (LDAP users come and go).
    actor = models.CharField(max_length=150, db_index=True)
    at = models.DateTimeField(default=timezone.now, db_index=True)
    action = models.CharField(max_length=64)  # e.g. topic.update, subscription.pause
    object_type = models.CharField(max_length=32)  # topic, subscription, pullpoint
    # A topic's path (as it was when changed) or a subscription / pull point id.
    object_id = models.CharField(max_length=1024, db_index=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.object_id}"

    @property
    def changes(self) -> list[tuple[str, object, object]]:
        """(field, before, after) for every field whose value differs."""
        before = self.before if isinstance(self.before, dict) else {}
        after = self.after if isinstance(self.after, dict) else {}
        keys = list(dict.fromkeys([*before, *after]))
        return [(k, before.get(k), after.get(k)) for k in keys if before.get(k) != after.get(k)]
