from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from subscriptions.cascades import topic_delete
from topics.models import Topic
from topics.selectors import POLICY_FIELDS
from topics.services import topic_create, topic_update


@admin.register(Topic)
class TopicAdmin(admin.ModelAdmin):
    """Saved through the topic services, so every change is validated, audited and reloaded."""

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
        # Renaming or moving a subtree rewrites every descendant's path: the console does that.
        return ("path", "name", "parent") if obj else ("path",)

    def save_model(self, request: HttpRequest, obj: Topic, form: Any, change: bool) -> None:
        if not change:
            path = f"{obj.parent.path}:{obj.name}" if obj.parent else obj.name
            created = topic_create(
                path=path,
                namespace=obj.namespace,
                description=obj.description,
                actor=request.user,  # type: ignore[arg-type]
            )
            obj.pk = created.pk
            fields = [f for f in form.changed_data if f in POLICY_FIELDS]
        else:
            fields = [
                f for f in form.changed_data if f in (*POLICY_FIELDS, "namespace", "description")
            ]
        if fields:
            topic_update(
                topic_id=obj.pk,
                changes={f: form.cleaned_data[f] for f in fields},
                actor=request.user,  # type: ignore[arg-type]
            )
        obj.refresh_from_db()

    def delete_model(self, request: HttpRequest, obj: Topic) -> None:
        topic_delete(topic_id=obj.pk, subscriptions="keep", actor=request.user)  # type: ignore[arg-type]

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Topic]) -> None:
        for topic in queryset.order_by("-path"):
            if Topic.objects.filter(pk=topic.pk).exists():  # not gone with a deleted ancestor
                self.delete_model(request, topic)
