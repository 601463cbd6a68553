"""Routes of /api/v1/ (mounted by hpwsn_site/urls.py), the schema and the docs pages."""

from __future__ import annotations

from typing import Any

from django.urls import path, re_path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView
from rest_framework import permissions
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from hpwsn_site.api import (
    analytics,
    operations,
    publish,
    registrations,
    subscriptions,
    tokens,
    topics,
)


class NotFoundView(APIView):
    schema = None  # not an operation
    authentication_classes: list[type] = []
    permission_classes: list[type] = []
    throttle_classes: list[type] = []

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        raise NotFound(f"no resource at {request.path}")


TOPIC = r"(?P<path>[^/]{1,1024})"
UUID = r"(?P<{}>[0-9a-fA-F-]{{32,36}})"


class IndexView(APIView):
    permission_classes = [permissions.AllowAny]  # the map of the API, open as its docs are

    @extend_schema(
        operation_id="api_index",
        summary="Where everything is: the resources, the schema and the docs",
        responses={200: OpenApiTypes.OBJECT},
    )
    def get(self, request: Request) -> Response:
        base = request.build_absolute_uri("/api/")
        return Response(
            {
                "resources": {r: base + "v1/" + r for r in RESOURCES},
                "schema": base + "schema/",
                "docs": base + "docs/",
            }
        )


RESOURCES = (
    "topics", "subscriptions", "pullpoints", "registrations", "deadletters", "consumers", "stats",
    "nodes", "audit", "analytics", "tokens",
)  # fmt: skip

v1 = [
    path("", IndexView.as_view()),
    path("tokens", tokens.TokenListView.as_view()),
    path("tokens/<int:pk>", tokens.TokenView.as_view()),
    path("topics", topics.TopicListView.as_view()),
    re_path(rf"^topics/{TOPIC}/messages$", publish.TopicMessagesView.as_view()),
    re_path(rf"^topics/{TOPIC}$", topics.TopicView.as_view()),
    path("subscriptions", subscriptions.SubscriptionListView.as_view()),
    re_path(rf"^subscriptions/{UUID.format('sub_id')}$", subscriptions.SubscriptionView.as_view()),
    *(
        re_path(
            rf"^subscriptions/{UUID.format('sub_id')}:{name}$",
            subscriptions.action_view(name, summary),
        )
        for name, summary in (
            ("pause", "Pause: messages wait queued"),
            ("resume", "Resume a paused or suspended subscription"),
            ("renew", "Set a new termination time"),
        )
    ),
    path("pullpoints", subscriptions.PullPointListView.as_view()),
    re_path(rf"^pullpoints/{UUID.format('pp_id')}$", subscriptions.PullPointView.as_view()),
    re_path(
        rf"^pullpoints/{UUID.format('pp_id')}/messages:pull$", subscriptions.PullView.as_view()
    ),
    path("registrations", registrations.RegistrationListView.as_view()),
    re_path(rf"^registrations/{UUID.format('reg_id')}$", registrations.RegistrationView.as_view()),
    re_path(
        rf"^registrations/{UUID.format('reg_id')}:renew$",
        registrations.RegistrationRenewView.as_view(),
    ),
    path("deadletters", operations.DeadLetterListView.as_view()),
    path("deadletters:redrive", operations.RedriveView.as_view()),
    path("deadletters/<int:pk>", operations.DeadLetterView.as_view()),
    path("consumers", operations.ConsumerListView.as_view()),
    path("stats", operations.StatsView.as_view()),
    path("nodes", operations.NodesView.as_view()),
    path("audit", operations.AuditListView.as_view()),
    path("analytics", analytics.RunListView.as_view()),
    re_path(rf"^analytics/{UUID.format('run_id')}$", analytics.RunView.as_view()),
    re_path(r"", NotFoundView.as_view()),  # anything else under /api/v1/: a problem, not HTML
]

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("docs/redoc/", SpectacularRedocView.as_view(url_name="api-schema"), name="api-redoc"),
]
