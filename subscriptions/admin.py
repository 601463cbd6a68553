from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from subscriptions.models import Subscription
from subscriptions.services import subscription_set_state


@admin.register(Subscription)
class SubscriptionAdmin(admin.ModelAdmin):
    """Shown to operators (suspended consumers at a glance); changed only through the services.

    Not deleted here either: Django's delete removes the row alone, and its queue, its Redis keys
    and its directory entry (which brings it back at the next start) would stay, with no audit
    entry. The console's Remove goes through the services."""

    list_display = ("id", "state", "mode", "consumer_address", "topic_expression", "updated_at")
    list_filter = ("state", "mode")
    search_fields = ("id", "consumer_address", "topic_expression")
    actions = ["resume"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.action(description="Resume (also suspended subscriptions) and push their queues")
    def resume(self, request: HttpRequest, queryset: QuerySet[Subscription]) -> None:
        ids = [str(i) for i in queryset.values_list("id", flat=True)]
        for sub_id in ids:
            subscription_set_state(subscription_id=sub_id, paused=False)
        self.message_user(request, f"{len(ids)} subscription(s) resumed.")
