from django.urls import path

from spark.consumers import RunProgressConsumer

websocket_urlpatterns = [path("ws/analytics/runs/<uuid:run_id>/", RunProgressConsumer.as_asgi())]
