from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from audit.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    """Read-only: the log is written by the services, never edited."""

    list_display = ("at", "actor", "action", "object_type", "object_id")
    list_filter = ("object_type", "action")
    search_fields = ("actor", "object_id")
    readonly_fields = ("at", "actor", "action", "object_type", "object_id", "before", "after")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
