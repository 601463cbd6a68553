from django.apps import AppConfig


class SparkConfig(AppConfig):
    name = "spark"
    label = "spark"
    verbose_name = "Analytics"
    default_auto_field = "django.db.models.BigAutoField"
