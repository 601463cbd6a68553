import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hpwsn_site.settings")

app = Celery("hpwsn")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
