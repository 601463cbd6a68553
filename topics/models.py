from __future__ import annotations

from django.db import models


class Topic(models.Model):
    """A node of the topic tree. Roots hang under one virtual root (thesis 4.5.4)."""

    name = models.CharField(max_length=128)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )
    # Colon path from the root (ALL:ALARM:ALARM1), unique across the tree.
    path = models.CharField(max_length=1024, unique=True, editable=False)
    # Only roots carry a namespace; a root without one matches expressions in any namespace.
    namespace = models.CharField(max_length=512, blank=True, default="")
    description = models.TextField(blank=True, default="")

    # Policy. Empty (None / "") inherits from the parent; the root defaults are in
    # topics.tree.ROOT_POLICY.
    class Reliability(models.TextChoices):
        RELIABLE = "reliable"
        FAST = "fast"

    reliability = models.CharField(
        max_length=8, choices=Reliability.choices, blank=True, default=""
    )
    ordered = models.BooleanField(null=True, blank=True)
    retry_schedule = models.CharField(
        max_length=256, blank=True, default="", help_text="seconds, comma separated"
    )
    priority = models.PositiveSmallIntegerField(null=True, blank=True, help_text="0 (low) - 9")
    ttl_seconds = models.PositiveIntegerField(
        null=True, blank=True, help_text="time to live of a message; 0 = no limit"
    )
    fragment_size = models.PositiveIntegerField(
        null=True, blank=True, help_text="bytes; 0 = never split"
    )
    partial_delivery = models.BooleanField(null=True, blank=True)
    auto_create_children = models.BooleanField(
        null=True, blank=True, help_text="publishing to an unknown child topic creates it"
    )
    # Access control (docs/protocol.md, "Security"). Members of hpwsn-admins may do anything.
    publish_groups = models.CharField(
        max_length=1024,
        blank=True,
        default="",
        help_text="groups whose members may publish, comma separated; * = any authenticated user",
    )
    subscribe_groups = models.CharField(
        max_length=1024,
        blank=True,
        default="",
        help_text="groups whose members may subscribe, comma separated; * = any authenticated user",
    )
    anonymous_publish = models.BooleanField(
        null=True, blank=True, help_text="callers without credentials may publish"
    )
    anonymous_subscribe = models.BooleanField(
        null=True, blank=True, help_text="callers without credentials may subscribe"
    )
    require_registration = models.BooleanField(
        null=True,
        blank=True,
        help_text="only publishers registered with RegisterPublisher for the topic may publish",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["path"]
        constraints = [
            models.UniqueConstraint(fields=["parent", "name"], name="topic_unique_child_name"),
        ]

    def __str__(self) -> str:
        return self.path

    @property
    def depth(self) -> int:
        return self.path.count(":") + 1


class Change(models.Model):
    """One entry of the change log: a topic subtree or a subscription that changed.

    Written in the transaction of the change itself (topics/changes.py), so a change is never
    committed without its entry. Entries are numbered without holes: the number is the last one
    plus one, taken under a transaction-scoped advisory lock, so a process that reads entry n + 2
    after n knows it missed n + 1 (the log was pruned) and rebuilds.
    """

    class Kind(models.TextChoices):
        TOPIC = "topic"  # key: the colon path of a subtree to load again
        SUBSCRIPTION = "sub"  # key: the id of a subscription to load again (or drop)

    id = models.BigIntegerField(primary_key=True)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    key = models.CharField(max_length=1024)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.id} {self.kind} {self.key}"
