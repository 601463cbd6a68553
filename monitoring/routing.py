from django.urls import path

from monitoring.consumers import StatsConsumer

websocket_urlpatterns = [path("ws/monitoring/", StatsConsumer.as_asgi())]
