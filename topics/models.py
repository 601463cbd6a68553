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
