from django.apps import AppConfig


class FederationConfig(AppConfig):
    name = "federation"
    default_auto_field = "django.db.models.BigAutoField"
