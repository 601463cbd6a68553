from django.apps import AppConfig


class SubscriptionsConfig(AppConfig):
    name = "subscriptions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers what a subscription change's copy in Redis carries (topics/changes.py), in
        # every process that writes one.
        from subscriptions import selectors  # noqa: F401
