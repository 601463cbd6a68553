from typing import Any

from django.contrib import admin
from django.db import transaction
from django.http import HttpRequest

from hpwsn_site import state
from topics.models import Topic
from topics.selectors import POLICY_FIELDS


@admin.register(Topic)
class TopicAdmin(admin.ModelAdmin):
    list_display = ("path", "namespace", "created_at")
    search_fields = ("path",)
    fieldsets = (
        (None, {"fields": ("name", "parent", "namespace", "description", "path")}),
        (
            "Policy (empty = inherited from the parent)",
            {"fields": POLICY_FIELDS},
        ),
    )
    readonly_fields = ("path",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        # Renaming or moving a subtree rewrites every descendant's path: not done from here.
        return ("path", "name", "parent") if obj else ("path",)

    def save_model(self, request: HttpRequest, obj: Topic, form: Any, change: bool) -> None:
        if not change:
            obj.path = f"{obj.parent.path}:{obj.name}" if obj.parent else obj.name
        super().save_model(request, obj, form, change)
        transaction.on_commit(lambda: state.bump(state.VERSION_TOPICS))

    def delete_model(self, request: HttpRequest, obj: Topic) -> None:
        super().delete_model(request, obj)
        transaction.on_commit(lambda: state.bump(state.VERSION_TOPICS))
