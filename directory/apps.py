from django.apps import AppConfig


class DirectoryConfig(AppConfig):
    """The OpenLDAP directory of record (docs/directory.md)."""

    name = "directory"
    default_auto_field = "django.db.models.BigAutoField"
