from django.contrib import admin
from django.http import HttpRequest, JsonResponse
from django.urls import path, re_path

from hpwsn_site.legacy import legacy_view
from hpwsn_site.soap import wsn_endpoint


async def healthz(request: HttpRequest) -> JsonResponse:
    from hpwsn_site import state

    redis_ok = bool(await state.get_async_redis().ping())
    return JsonResponse({"status": "ok" if redis_ok else "degraded", "redis": redis_ok})


urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", healthz),
    path("wsn/legacy/", legacy_view),
    path("wsn/", wsn_endpoint),
    re_path(
        r"^wsn/(?P<kind>subscriptions|pullpoints)/(?P<resource_id>[^/]{1,128})/?$",
        wsn_endpoint,
    ),
]
