"""Read-only views of the synchronisation state: links to directory entries, queued writes."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from directory.models import RegistrationWrite, SubscriptionWrite, TopicLink


class _ReadOnly(admin.ModelAdmin):  # type: ignore[type-arg]
    """Written by the synchronisation alone: a deleted link makes its topic's entry look new to
    the next sync, a deleted write leaves the directory behind."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(TopicLink)
class TopicLinkAdmin(_ReadOnly):
    list_display = ("dn", "topic", "entry_uuid", "updated_at")
    search_fields = ("dn", "topic__path")


@admin.register(SubscriptionWrite)
class SubscriptionWriteAdmin(_ReadOnly):
    list_display = ("subscription_id", "attempts", "next_try_at", "last_error", "updated_at")
    search_fields = ("subscription_id",)


@admin.register(RegistrationWrite)
class RegistrationWriteAdmin(_ReadOnly):
    list_display = ("registration_id", "attempts", "next_try_at", "last_error", "updated_at")
    search_fields = ("registration_id",)
