from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "hpwsn_site.api"
    label = "api"
    verbose_name = "REST API"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from hpwsn_site.api import schema  # noqa: F401 - registers the OpenAPI auth extensions
