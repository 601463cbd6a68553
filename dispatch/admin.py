from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from dispatch.deadletters import dead_letters_redrive
from dispatch.models import ConsumerLimit, DeadLetter
from dispatch.services import consumer_limit_set


@admin.register(DeadLetter)
class DeadLetterAdmin(admin.ModelAdmin):
    """Read-only: letters leave the store once a redrive has delivered them."""

    list_display = (
        "id",
        "created_at",
        "reason",
        "consumer_address",
        "subscription_id",
        "notification_id",
        "topic",
        "redriven_at",
    )
    list_filter = ("reason", ("redriven_at", admin.EmptyFieldListFilter))
    ordering = ("-id",)  # newest first
    search_fields = ("subscription_id", "consumer_address", "notification_id", "topic")
    actions = ["redrive"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.action(description="Redrive to the subscription's queue")
    def redrive(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> None:
        selected = list(queryset.values_list("id", flat=True))
        done = dead_letters_redrive(ids=selected)
        self.message_user(request, f"{done} of {len(selected)} letter(s) redriven.")
        if done < len(selected):
            self.message_user(
                request,
                "The others were already redriven or belong to subscriptions that no longer exist.",
                messages.WARNING,
            )


@admin.register(ConsumerLimit)
class ConsumerLimitAdmin(admin.ModelAdmin):
    """Flow control per consumer; saved through the service so every worker reloads it."""

    list_display = ("consumer", "window", "rate")
    search_fields = ("consumer",)

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        consumer_limit_set(consumer=obj.consumer, window=obj.window, rate=obj.rate)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        consumer_limit_set(consumer=obj.consumer, window=None, rate=None)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        for limit in queryset:
            self.delete_model(request, limit)
