from django.contrib import admin
from django.urls import include, path, re_path

from hpwsn_site.api.urls import urlpatterns as api_docs
from hpwsn_site.api.urls import v1 as api_v1
from hpwsn_site.legacy import legacy_view
from hpwsn_site.loginguard import AdminLoginForm
from hpwsn_site.soap import wsn_endpoint

# The admin's "view site" link leads to the operators' console.
admin.site.site_url = "/console/"
admin.site.login_form = AdminLoginForm  # password guessing is throttled (hpwsn_site/loginguard.py)

urlpatterns = [
    path("admin/", admin.site.urls),
    path("console/", include("console.urls")),  # the operators' console
    path("api/v1/", include(api_v1)),  # REST API (docs/api.md)
    path("api/", include(api_docs)),  # its OpenAPI schema, Swagger UI and Redoc
    path("analytics/", include("spark.urls")),  # the analysts' Spark charts
    path("", include("monitoring.urls")),  # /monitoring/, /metrics, /healthz
    path("federation/", include("federation.urls")),  # peers push here (docs/deployment.md)
    path("wsn/legacy/", legacy_view),
    path("wsn/", wsn_endpoint),
    re_path(
        r"^wsn/(?P<kind>subscriptions|pullpoints|registrations)/(?P<resource_id>[^/]{1,128})/?$",
        wsn_endpoint,
    ),
]
