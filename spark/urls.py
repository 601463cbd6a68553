from django.urls import path

from spark import views

app_name = "analytics"

urlpatterns = [
    path("", views.page, name="page"),
    path("runs/", views.run_start, name="run-start"),
    path("runs/<uuid:run_id>/", views.run_status, name="run-status"),
    path("runs/<uuid:run_id>/<slug:job>.csv", views.result_csv, name="result-csv"),
]
