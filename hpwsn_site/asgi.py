import os

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

from hpwsn_site.fastpath import wrap  # noqa: E402
from monitoring.heartbeat import node_start  # noqa: E402
from monitoring.routing import websocket_urlpatterns  # noqa: E402
from spark.routing import websocket_urlpatterns as analytics_websockets  # noqa: E402

application = ProtocolTypeRouter(
    {
        # SOAP POSTs take the fast path; everything else over HTTP goes to Django.
        "http": wrap(django_application),
        # The dashboard's and the analytics page's sockets: the session login, and only from
        # pages of our own hosts.
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns + analytics_websockets))
        ),
    }
)

# Each web process (uvicorn --workers N builds the app in each) is a node of the registry.
node_start(role="web")
