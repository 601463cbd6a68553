"""/api/v1/registrations: publisher registrations (RegisterPublisher, DestroyRegistration, Renew).

Every write goes to `subscriptions.registrations`, the services of the SOAP operations, with the
caller as principal (the topics' publish ACL at create; the owner rule of subscriptions for
renew and destroy, asked first through `permissions.subscription_authorize`).
"""

from __future__ import annotations

from typing import Any

import django_filters
from django.db.models import Q, QuerySet
from django.utils import timezone
from drf_spectacular.utils import OpenApiExample, extend_schema, extend_schema_view
from rest_framework import generics, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from hpwsn_site.api.auth import principal_of
from hpwsn_site.api.permissions import (
    PolicyDecides,
    reveals,
    subscription_authorize,
    subscriptions_visible,
    tagged,
)
from hpwsn_site.api.schema import problem_responses
from hpwsn_site.api.subscriptions import TAGGED, ByCreation, RenewIn, topic_ref
from hpwsn_site.clients import request_client
from hpwsn_site.soap import base_url
from monitoring.counters import consumer_label
from subscriptions import registrations
from subscriptions.models import PublisherRegistration


def _registration(request: Request, reg_id: str, operation: str) -> PublisherRegistration:
    reg = registrations.registration_live(registration_id=reg_id)
    subscription_authorize(principal=principal_of(request), subscription=reg, operation=operation)
    return reg


class RegistrationIn(serializers.Serializer):
    publisher = serializers.CharField(
        max_length=2048, help_text="the PublisherReference address (its Notify messages name it)"
    )
    topics = serializers.ListField(
        child=serializers.CharField(max_length=1024),
        required=False,
        max_length=100,
        help_text="concrete topics (each covers its subtree); none = every topic",
    )
    dialect = serializers.CharField(
        required=False, help_text="simple, concrete, colon or a dialect URI (default: guess)"
    )
    namespaces = serializers.DictField(child=serializers.CharField(), required=False)
    demand = serializers.BooleanField(
        default=False,
        help_text="demand-based: the broker subscribes to the publisher only while it has "
        "subscribers for the topics",
    )
    termination = serializers.CharField(
        required=False, help_text="xsd:duration (PT1H) or xsd:dateTime; none = never"
    )


class DemandOut(serializers.Serializer):
    address = serializers.CharField(
        help_text="the broker's subscription at the publisher; analysts see its host:port for "
        "a registration they do not own"
    )
    paused = serializers.BooleanField()


class RegistrationOut(serializers.Serializer):
    id = serializers.CharField(help_text="the registration's id (a UUID)." + TAGGED)
    reference = serializers.CharField(
        allow_null=True,
        help_text="the PublisherRegistrationReference address; null for analysts on what they "
        "do not own (the address renews and destroys it)",
    )
    consumer = serializers.CharField(help_text="where the publisher sends its Notify messages")
    publisher = serializers.CharField()
    topics = serializers.ListField(child=serializers.CharField(), help_text="[] = every topic")
    demand = serializers.BooleanField()
    demand_state = serializers.DictField(
        child=DemandOut(), help_text="per topic: the broker's subscription at the publisher"
    )
    termination_time = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()


def registration_out(request: Request, reg: PublisherRegistration) -> dict[str, Any]:
    """A registration as this caller may see it (permissions.reveals)."""
    out = {
        "id": str(reg.id),
        "reference": reg.reference_address,
        "consumer": reg.broker_address,
        "publisher": reg.publisher_address,
        "topics": list(reg.topic_paths),
        "demand": reg.demand,
        "demand_state": reg.demand_state,
        "termination_time": reg.termination_time,
        "created_at": reg.created_at,
    }
    if not reveals(principal=principal_of(request), owner=reg.owner):
        out["id"] = tagged(reg.id)
        out["reference"] = None
        out["demand_state"] = {
            path: {**held, "address": consumer_label(str(held.get("address", "")))}
            for path, held in reg.demand_state.items()
        }
    return out


class RegistrationFilter(django_filters.FilterSet):
    publisher = django_filters.CharFilter(field_name="publisher_address", lookup_expr="icontains")
    topic = django_filters.CharFilter(
        method="covering", help_text="a topic path: the registrations that cover it"
    )
    demand = django_filters.BooleanFilter()

    class Meta:
        model = PublisherRegistration
        fields = ["publisher", "topic", "demand"]

    def covering(
        self, qs: QuerySet[PublisherRegistration], name: str, value: str
    ) -> QuerySet[PublisherRegistration]:
        # In Python: JSON containment is not portable (SQLite), and registrations are few.
        rows = qs.values_list("id", "topic_paths")
        return qs.filter(
            id__in=[
                pk
                for pk, paths in rows
                if registrations.registration_covers(topic_paths=paths, topic_path=value)
            ]
        )


@extend_schema_view(
    get=extend_schema(
        operation_id="registrations_list",
        summary="List publisher registrations (the roles: all; others: their own)",
        responses={200: RegistrationOut(many=True), **problem_responses(400, 401, 429)},
    ),
    post=extend_schema(
        operation_id="registrations_create",
        summary="Register a publisher (RegisterPublisher)",
        description=(
            "The same RegisterPublisher as SOAP: the caller must be allowed to publish on every "
            "topic. A topic whose policy sets require_registration then accepts Notify messages "
            "whose ProducerReference is this publisher. With demand, the broker subscribes to "
            "the publisher's NotificationProducer only while the topics have subscribers."
        ),
        request=RegistrationIn,
        responses={201: RegistrationOut, **problem_responses(400, 401, 403, 404, 429)},
        examples=[
            OpenApiExample(
                "a sensor on one subtree, for an hour",
                {
                    "publisher": "http://sensor-7.example/wsn",
                    "topics": ["ALL:ALARM"],
                    "termination": "PT1H",
                },
            ),
        ],
    ),
)
class RegistrationListView(generics.ListAPIView):
    permission_classes = [PolicyDecides]
    serializer_class = RegistrationOut
    filterset_class = RegistrationFilter
    pagination_class = ByCreation

    def get_queryset(self) -> QuerySet[PublisherRegistration]:
        live = PublisherRegistration.objects.filter(
            Q(termination_time__isnull=True) | Q(termination_time__gt=timezone.now())
        )
        return subscriptions_visible(principal=principal_of(self.request), queryset=live)

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        return self.get_paginated_response([registration_out(request, r) for r in page or []])

    def post(self, request: Request) -> Response:
        data = RegistrationIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        nsmap = v.get("namespaces") or {}
        reg = registrations.registration_create(
            publisher_address=v["publisher"],
            topics=[topic_ref(t, v.get("dialect"), nsmap) for t in v.get("topics") or []],
            demand=v["demand"],
            initial_termination_time=v.get("termination"),
            base_url=base_url(request),
            principal=principal_of(request),
            client=request_client(request.META),
        )
        return Response(registration_out(request, reg), status=201)


class RegistrationView(APIView):
    permission_classes = [PolicyDecides]

    @extend_schema(
        operation_id="registration_get",
        summary="A publisher registration",
        responses={200: RegistrationOut, **problem_responses(401, 403, 404, 429)},
    )
    def get(self, request: Request, reg_id: str) -> Response:
        return Response(registration_out(request, _registration(request, reg_id, "read")))

    @extend_schema(
        operation_id="registration_destroy",
        summary="DestroyRegistration: the publisher is no longer registered",
        description=(
            "Answered at once; the broker's subscriptions at a demand publisher are ended by a "
            "background task right after."
        ),
        responses={204: None, **problem_responses(401, 403, 404, 429)},
    )
    def delete(self, request: Request, reg_id: str) -> Response:
        registrations.registration_destroy(registration_id=reg_id, principal=principal_of(request))
        return Response(status=204)


class RegistrationRenewView(APIView):
    permission_classes = [PolicyDecides]

    @extend_schema(
        operation_id="registration_renew",
        summary="Set a new termination time",
        request=RenewIn,
        examples=[OpenApiExample("one more hour", {"termination": "PT1H"})],
        responses={200: RegistrationOut, **problem_responses(400, 401, 403, 404, 429)},
    )
    def post(self, request: Request, reg_id: str) -> Response:
        _registration(request, reg_id, "renew")  # who may, before what was sent is read
        data = RenewIn(data=request.data)
        data.is_valid(raise_exception=True)
        reg = registrations.registration_renew(
            registration_id=reg_id,
            termination_time=data.validated_data["termination"],
            principal=principal_of(request),
        )
        return Response(registration_out(request, reg))
