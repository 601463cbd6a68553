from __future__ import annotations

from django.db import models

from topics.models import Topic


class TopicLink(models.Model):
    """Pairs a topic with its directory entry and the view both sides last agreed on.

    The agreed view is the base of a three-way comparison: a side whose view differs from it has
    changed since the last synchronisation (docs/directory.md). A link whose topic is gone (NULL)
    stands for a topic deleted in Django whose entry is still to be deleted in the directory.
    """

    topic = models.OneToOneField(
        Topic, null=True, blank=True, on_delete=models.SET_NULL, related_name="directory_link"
    )
    entry_uuid = models.CharField(max_length=64, unique=True)
    dn = models.CharField(max_length=2048)
    agreed = models.JSONField(default=dict)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return self.dn


class OutboxWrite(models.Model):
    """Outbox row: an object whose directory entry has to be brought up to date.

    One row per object (a later change replaces the pending one): the write reads the object when
    it runs, so it writes the latest state, or deletes the entry when the object is gone.
    `version` lets the writer remove the row only if nothing changed since.
    """

    version = models.PositiveIntegerField(default=1)
    attempts = models.PositiveIntegerField(default=0)
    next_try_at = models.DateTimeField(db_index=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True
        ordering = ["next_try_at"]


class SubscriptionWrite(OutboxWrite):
    """Outbox: a subscription whose entry under ou=subscriptions has to be brought up to date."""

    subscription_id = models.UUIDField(unique=True)

    class Meta(OutboxWrite.Meta):
        pass

    def __str__(self) -> str:
        return str(self.subscription_id)


class RegistrationWrite(OutboxWrite):
    """Outbox: a publisher registration whose entry under ou=registrations has to be brought up
    to date."""

    registration_id = models.UUIDField(unique=True)

    class Meta(OutboxWrite.Meta):
        pass

    def __str__(self) -> str:
        return str(self.registration_id)
