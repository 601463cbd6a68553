"""/api/v1/ for operators and analysts: dead letters, consumer limits, stats, nodes, audit."""

from __future__ import annotations

import time
from typing import Any

import django_filters
from django.conf import settings
from django.db.models import QuerySet
from drf_spectacular.plumbing import build_array_type, build_basic_type
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, extend_schema, extend_schema_view
from rest_framework import generics, serializers
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.models import AuditEntry
from audit.selectors import audit_entries
from console import services as console
from console.selectors import audit_rows_masked
from dispatch import services as dispatch
from dispatch.flow import consumer_of
from dispatch.models import ConsumerLimit, DeadLetter
from dispatch.selectors import dead_letters
from hpwsn import errors
from hpwsn_site.api.auth import principal_of
from hpwsn_site.api.permissions import OperatorsWriteAnalystsRead, shows_tags, tagged
from hpwsn_site.api.schema import problem_responses
from monitoring.counters import consumer_label
from monitoring.selectors import nodes_list, snapshot_compute
from subscriptions.models import Subscription

# ----------------------------------------------------------------------------- dead letters


class DeadLetterOut(serializers.ModelSerializer):
    message = serializers.SerializerMethodField(help_text="the stored NotificationMessage, XML")

    class Meta:
        model = DeadLetter
        fields = [
            "id", "subscription_id", "consumer_address", "notification_id", "topic", "reason",
            "created_at", "redriven_at", "attempts", "message",
        ]  # fmt: skip
        extra_kwargs = {
            "subscription_id": {
                "help_text": "the subscription's id (a UUID; '' if unroutable). Analysts see `#` "
                "and a tag instead for a subscription they do not own."
            },
            "consumer_address": {
                "help_text": "the consumer's address; analysts see its host:port for a "
                "subscription they do not own"
            },
        }

    def get_message(self, obj: DeadLetter) -> str:
        return bytes(obj.message).decode("utf-8", errors="replace")

    def to_representation(self, instance: DeadLetter) -> dict[str, Any]:
        out: dict[str, Any] = super().to_representation(instance)
        owned = self.context.get("owned")  # None: the caller sees every letter in full
        if owned is not None and instance.subscription_id not in owned:
            if instance.subscription_id:
                out["subscription_id"] = tagged(instance.subscription_id)
            out["consumer_address"] = consumer_label(instance.consumer_address)
        return out


class DeadLettersShown:
    """Dead letters as the caller may see them: analysts, the letters of the subscriptions they
    own in full and the others' by tag and consumer host (permissions.reveals)."""

    request: Request

    def get_serializer_context(self) -> dict[str, Any]:
        context: dict[str, Any] = super().get_serializer_context()  # type: ignore[misc]
        principal = principal_of(self.request)
        if shows_tags(principal):
            mine = Subscription.objects.filter(owner__iexact=principal.owner)
            context["owned"] = {str(pk) for pk in mine.values_list("id", flat=True)}
        return context


class DeadLetterFilter(django_filters.FilterSet):
    subscription = django_filters.CharFilter(
        method="by_subscription",
        help_text="a subscription's id, or `#` and its tag (what analysts see of others')",
    )
    since = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    reason = django_filters.ChoiceFilter(choices=DeadLetter.Reason.choices)
    redriven = django_filters.BooleanFilter(
        field_name="redriven_at", lookup_expr="isnull", exclude=True
    )

    class Meta:
        model = DeadLetter
        fields = ["subscription", "since", "reason", "redriven"]

    def by_subscription(
        self, qs: QuerySet[DeadLetter], name: str, value: str
    ) -> QuerySet[DeadLetter]:
        value = value.strip()
        if not value.startswith("#"):
            return qs.filter(subscription_id=value)
        # A tag is no id: the subscriptions that have letters are tagged, and the one that
        # matches found (a tag names one subscription, the id stays unknown to the caller).
        tag = value[1:].lower()
        ids = qs.exclude(subscription_id="").values_list("subscription_id", flat=True).distinct()
        return qs.filter(subscription_id__in=[i for i in ids if tagged(i) == "#" + tag])


class ById(CursorPagination):
    ordering = "-id"
    page_size = 100
    max_page_size = 1000
    page_size_query_param = "limit"


class RedriveIn(serializers.Serializer):
    ids = serializers.ListField(child=serializers.IntegerField(min_value=1), required=False)
    subscription = serializers.CharField(required=False, help_text="every letter of this one")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not attrs.get("ids") and not attrs.get("subscription"):
            raise serializers.ValidationError("give 'ids', 'subscription' or both")
        return attrs


class CountOut(serializers.Serializer):
    count = serializers.IntegerField()


@extend_schema_view(
    get=extend_schema(
        operation_id="deadletters_list",
        summary="Dead letters, newest first, with their attempts",
        responses={200: DeadLetterOut(many=True), **problem_responses(400, 401, 403, 429)},
    )
)
class DeadLetterListView(DeadLettersShown, generics.ListAPIView):
    permission_classes = [OperatorsWriteAnalystsRead]
    serializer_class = DeadLetterOut
    filterset_class = DeadLetterFilter
    pagination_class = ById

    def get_queryset(self) -> QuerySet[DeadLetter]:
        return dead_letters()


class DeadLetterView(DeadLettersShown, generics.RetrieveAPIView):
    permission_classes = [OperatorsWriteAnalystsRead]
    serializer_class = DeadLetterOut
    queryset = DeadLetter.objects.all()

    @extend_schema(
        operation_id="deadletter_get",
        summary="One dead letter with every attempt",
        responses={200: DeadLetterOut, **problem_responses(401, 403, 404, 429)},
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(
        operation_id="deadletter_delete",
        summary="Drop a dead letter",
        responses={204: None, **problem_responses(401, 403, 404, 429)},
    )
    def delete(self, request: Request, pk: int) -> Response:
        if not console.dead_letters_delete_by_operator(
            ids=[pk], actor=principal_of(request).name or ""
        ):
            raise errors.ResourceUnknown(f"dead letter {pk} does not exist (or is being redriven)")
        return Response(status=204)


class RedriveView(APIView):
    permission_classes = [OperatorsWriteAnalystsRead]

    @extend_schema(
        operation_id="deadletters_redrive",
        summary="Redrive dead letters: some, or all of a subscription's",
        request=RedriveIn,
        examples=[
            OpenApiExample("some letters", {"ids": [17, 18]}),
            OpenApiExample(
                "all of a subscription's", {"subscription": "4f0c2d9e-5b1a-4c3e-9f2a-8d7e6c5b4a39"}
            ),
        ],
        responses={200: CountOut, **problem_responses(400, 401, 403, 429)},
    )
    def post(self, request: Request) -> Response:
        data = RedriveIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        count = console.dead_letters_redrive_by_operator(
            ids=v.get("ids"),
            subscription_id=v.get("subscription"),
            actor=principal_of(request).name or "",
        )
        return Response({"count": count})


# ----------------------------------------------------------------------------- consumers


class ConsumerOut(serializers.Serializer):
    consumer = serializers.CharField(help_text="scheme://host:port")
    window = serializers.IntegerField(allow_null=True, help_text="null: HPWSN_CONSUMER_WINDOW")
    rate = serializers.FloatField(allow_null=True, help_text="null: HPWSN_CONSUMER_RATE")


class ConsumerIn(serializers.Serializer):
    consumer = serializers.URLField(max_length=300, help_text="a URL of the consumer")
    window = serializers.IntegerField(allow_null=True, min_value=0, max_value=1_000_000)
    rate = serializers.FloatField(allow_null=True, min_value=0, max_value=1_000_000)


class ConsumersOut(serializers.Serializer):
    defaults = ConsumerOut()
    consumers = ConsumerOut(many=True)


class ConsumerListView(APIView):
    permission_classes = [OperatorsWriteAnalystsRead]
    throttle_scope = "api"

    @extend_schema(
        operation_id="consumers_list",
        summary="Flow-control limits per consumer origin, and the broker's defaults",
        responses={200: ConsumersOut, **problem_responses(401, 403, 429)},
    )
    def get(self, request: Request) -> Response:
        rows = ConsumerLimit.objects.order_by("consumer")
        return Response(
            {
                "defaults": {
                    "consumer": "*",
                    "window": settings.HPWSN_CONSUMER_WINDOW,
                    "rate": settings.HPWSN_CONSUMER_RATE,
                },
                "consumers": [
                    {"consumer": r.consumer, "window": r.window, "rate": r.rate} for r in rows
                ],
            }
        )

    @extend_schema(
        operation_id="consumers_set",
        summary="Set one consumer's window and rate (both null: back to the defaults)",
        request=ConsumerIn,
        examples=[
            OpenApiExample(
                "a slow consumer", {"consumer": "http://10.0.0.5:8080", "window": 20, "rate": 50}
            ),
            OpenApiExample(
                "back to the defaults",
                {"consumer": "http://10.0.0.5:8080", "window": None, "rate": None},
            ),
        ],
        responses={200: ConsumerOut, **problem_responses(400, 401, 403, 429)},
    )
    def put(self, request: Request) -> Response:
        data = ConsumerIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        dispatch.consumer_limit_set(consumer=v["consumer"], window=v["window"], rate=v["rate"])
        return Response(
            {"consumer": consumer_of(v["consumer"]), "window": v["window"], "rate": v["rate"]}
        )


# ----------------------------------------------------------------------------- monitoring


class StatsView(APIView):
    permission_classes = [OperatorsWriteAnalystsRead]

    @extend_schema(
        operation_id="stats_get",
        summary="The monitoring snapshot: rates, totals, latency, queues, nodes",
        responses={200: OpenApiTypes.OBJECT, **problem_responses(401, 403, 429)},
    )
    def get(self, request: Request) -> Response:
        return Response(snapshot_compute(now=time.time()))


class NodesView(APIView):
    permission_classes = [OperatorsWriteAnalystsRead]

    @extend_schema(
        operation_id="nodes_list",
        summary="The node registry: every web, worker and beat process with its heartbeat",
        responses={
            200: build_array_type(build_basic_type(OpenApiTypes.OBJECT)),
            **problem_responses(401, 403, 429),
        },
    )
    def get(self, request: Request) -> Response:
        return Response(nodes_list(now=time.time()))


MASKED = (
    "; analysts see the ids of subscriptions and pull points as `#` and a tag, and addresses "
    "as a consumer's host:port"
)


class AuditOut(serializers.ModelSerializer):
    object_id = serializers.CharField(help_text="the object's id or path" + MASKED)
    before = serializers.JSONField(help_text="the object before (null: created)" + MASKED)
    after = serializers.JSONField(help_text="the object after (null: removed)" + MASKED)

    class Meta:
        model = AuditEntry
        fields = ["id", "actor", "at", "action", "object_type", "object_id", "before", "after"]


class AuditFilter(django_filters.FilterSet):
    actor = django_filters.CharFilter(field_name="actor", lookup_expr="iexact")
    object_type = django_filters.CharFilter()
    object = django_filters.CharFilter(
        method="object_contains",
        help_text="a part of the object's id or path; analysts: of a topic's path only",
    )

    class Meta:
        model = AuditEntry
        fields = ["actor", "object_type", "object"]

    def object_contains(
        self, qs: QuerySet[AuditEntry], name: str, value: str
    ) -> QuerySet[AuditEntry]:
        qs = qs.filter(object_id__icontains=value)
        if shows_tags(principal_of(self.request)):
            # Topics only, as in the console: counts of substring matches would spell out the
            # ids of subscriptions and pull points.
            qs = qs.filter(object_type="topic")
        return qs


class ByTime(CursorPagination):
    ordering = ("-at", "-id")
    page_size = 100
    max_page_size = 1000
    page_size_query_param = "limit"


@extend_schema_view(
    get=extend_schema(
        operation_id="audit_list",
        summary="The audit log, newest first",
        responses={200: AuditOut(many=True), **problem_responses(400, 401, 403, 429)},
    )
)
class AuditListView(generics.ListAPIView):
    permission_classes = [OperatorsWriteAnalystsRead]
    serializer_class = AuditOut
    filterset_class = AuditFilter
    pagination_class = ByTime

    def get_queryset(self) -> QuerySet[AuditEntry]:
        return audit_entries()

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset())) or []
        shown = audit_rows_masked(entries=page) if shows_tags(principal_of(request)) else page
        return self.get_paginated_response(AuditOut(shown, many=True).data)
