from django.urls import path

from monitoring import views

urlpatterns = [
    path("monitoring/", views.dashboard, name="monitoring-dashboard"),
    path("metrics", views.metrics, name="metrics"),
    path("healthz", views.healthz, name="healthz"),
    path("vendor/<str:name>", views.vendor_asset, name="vendor-asset"),
]
