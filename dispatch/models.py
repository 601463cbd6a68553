from __future__ import annotations

from django.db import models

from dispatch.items import letter_mark, queue_item


class DeadLetter(models.Model):
    """A message the broker gave up pushing: a permanent failure or an exhausted retry schedule."""

    class Reason(models.TextChoices):
        PERMANENT = "permanent"  # 4xx other than 408/429, or a refused consumer address
        EXHAUSTED = "exhausted"  # every step of the retry schedule failed
        # The fan-out could not route the message at all (no subscription: subscription_id "")
        UNROUTABLE = "unroutable"

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
    # Set by a redrive: the letter is queued again and the row stays until the consumer took it,
    # so a redriven letter survives a Redis loss (dispatch/reliable.py re-queues it).
    redriven_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.notification_id} -> {self.consumer_address} ({self.reason})"

    @property
    def queue_item(self) -> bytes:
        """The item a redrive queues: the message id and, as its mark, the letter's row."""
        return queue_item(self.notification_id.encode(), letter_mark(self.id))


class StoredMessage(models.Model):
    """A notification accepted on a `reliable` topic: the durable log the fan-out reads in order.

    The row is committed before the publisher gets its answer. It is deleted once every
    subscription's low watermark has passed it (or it expired): see dispatch/reliable.py.
    """

    seq = models.BigAutoField(primary_key=True)
    notification_id = models.CharField(max_length=32)
    topic_path = models.CharField(max_length=1024)
    priority = models.PositiveSmallIntegerField(default=4)
    payload = models.BinaryField()  # the stored NotificationMessage fragment
    accepted_at = models.FloatField(db_index=True)  # epoch seconds, as in the notification id
    expires_at = models.FloatField(null=True, blank=True, db_index=True)
    # Idempotent publish: wsa:MessageID or Idempotency-Key, with the message's index in its Notify.
    idempotency_key = models.CharField(max_length=300, null=True, blank=True, unique=True)

    def __str__(self) -> str:
        return f"{self.seq} {self.topic_path}"


class DeliveryCursor(models.Model):
    """A durable copy of a watermark kept in Redis, written every checkpoint.

    `fanout`: the log has been moved into queues up to `seq`. `sub:<id>`: the subscription has
    been given (or dead-lettered, or expired) every matching message up to `seq`.
    """

    name = models.CharField(max_length=64, primary_key=True)
    seq = models.BigIntegerField()
    updated_at = models.FloatField()

    def __str__(self) -> str:
        return f"{self.name}={self.seq}"


class ConsumerLimit(models.Model):
    """Flow control for one consumer (scheme://host:port) over the broker's defaults."""

    consumer = models.CharField(
        max_length=300, unique=True, help_text="scheme://host:port, e.g. http://10.0.0.5:8080"
    )
    window = models.PositiveIntegerField(
        null=True, blank=True, help_text="messages in flight at once; empty: HPWSN_CONSUMER_WINDOW"
    )
    rate = models.FloatField(
        null=True, blank=True, help_text="messages per second; empty: HPWSN_CONSUMER_RATE, 0: none"
    )

    def __str__(self) -> str:
        return self.consumer
