import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hpwsn_site.settings")

django_application = get_asgi_application()

# Static files (/static/: the API docs' Swagger UI and Redoc from drf-spectacular-sidecar, the
# admin's styles) are served by this process from the installed apps, with nothing to collect: no
# other server stands in front of uvicorn in `make run`, and the docs must work offline.
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

django_application = ASGIStaticFilesHandler(django_application)

# Its requests' synchronous work on a fixed set of threads that keep their database connections.
from hpwsn_site.requestthreads import request_threads  # noqa: E402

django_application = request_threads(django_application)

# Imports below need the settings configured above.
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402

from hpwsn_site.fastpath import wrap  # noqa: E402
from monitoring.heartbeat import node_start  # noqa: E402
from monitoring.routing import websocket_urlpatterns  # noqa: E402
from spark.routing import websocket_urlpatterns as analytics_websockets  # noqa: E402


def _own_origin(scope: dict[str, Any]) -> bool:
    """Whether the socket's Origin is its own (scheme, host and port of the request) or one the
    console's forms are trusted from, as Django's CSRF check wants of a form.

    AllowedHostsOriginValidator compares host names only, and a browser sends the operator's
    session cookie to every port of a host: a page served on another port of an allowed host, or
    over the other scheme, could open the socket and read the dashboard.
    """
    headers = dict(scope.get("headers") or [])
    origin = headers.get(b"origin", b"").decode("latin-1").lower()
    host = headers.get(b"host", b"").decode("latin-1").lower()
    tls = scope.get("scheme") == "wss" or (
        settings.HPWSN_API_PROXIES > 0 and headers.get(b"x-forwarded-proto") == b"https"
    )
    own = f"{'https' if tls else 'http'}://{host}"
    trusted = {o.lower() for o in settings.CSRF_TRUSTED_ORIGINS}
    return bool(origin) and bool(host) and (origin == own or origin in trusted)


class SameOriginValidator:
    """Only pages of the server's own hosts, and of the socket's own origin, may connect."""

    def __init__(self, app: Any) -> None:
        self.application = AllowedHostsOriginValidator(app)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if _own_origin(scope):
            return await self.application(scope, receive, send)
        # Closed before the handshake (403), without channels' WebsocketDenier: that consumer
        # waits on the channel layer, and its Redis read timed out in the log of every refusal.
        await receive()  # websocket.connect
        await send({"type": "websocket.close"})
        return None


application = ProtocolTypeRouter(
    {
        # SOAP POSTs take the fast path; everything else over HTTP goes to Django.
        "http": wrap(django_application),
        # The dashboard's and the analytics page's sockets: the session login, and only from
        # pages of our own origin.
        "websocket": SameOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns + analytics_websockets))
        ),
    }
)

# Each web process (uvicorn --workers N builds the app in each) is a node of the registry.
node_start(role="web")
