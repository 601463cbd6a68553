from django.urls import path

from federation.views import inbound

urlpatterns = [
    path("in/<slug:peer>/<slug:token>/", inbound, name="federation-inbound"),
]
