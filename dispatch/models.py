from __future__ import annotations

from django.db import models


class DeadLetter(models.Model):
    """A message the broker gave up pushing: a permanent failure or an exhausted retry schedule."""

    class Reason(models.TextChoices):
        PERMANENT = "permanent"  # 4xx other than 408/429, or a refused consumer address
        EXHAUSTED = "exhausted"  # every step of the retry schedule failed

    # Not a foreign key: the letter outlives an unsubscribed or expired subscription.
    subscription_id = models.CharField(max_length=36, db_index=True)
    consumer_address = models.CharField(max_length=2048)
    notification_id = models.CharField(max_length=64)
    topic = models.CharField(max_length=1024, blank=True, default="")  # as the publisher named it
    message = models.BinaryField()  # the stored NotificationMessage fragment, as queued
    reason = models.CharField(max_length=16, choices=Reason.choices)
    # Every attempt at the batch: {"time", "status", "detail" (<= 200 chars), "duration_ms"}.
    attempts = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.notification_id} -> {self.consumer_address} ({self.reason})"
