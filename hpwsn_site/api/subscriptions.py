"""/api/v1/subscriptions and /api/v1/pullpoints: the services the SOAP edge and the console call.

Create goes to `subscriptions.services.subscription_create` with the caller as principal (the
topics' subscribe ACL); pause, resume, renew and delete go through the console's services (the
subscription services plus the audit log); every action on one object first asks
`permissions.subscription_authorize`.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import django_filters
from django.db.models import Q, QuerySet
from drf_spectacular.utils import OpenApiExample, extend_schema, extend_schema_view
from rest_framework import generics, serializers
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console import services as console
from console.selectors import consumer_host_contains, subscription_rows
from hpwsn import cloudevents, errors, ns, wsn
from hpwsn.client import resolve_dialect
from hpwsn_site import state
from hpwsn_site.api.auth import principal_of
from hpwsn_site.api.permissions import (
    PolicyDecides,
    reveals,
    shows_tags,
    subscription_authorize,
    subscriptions_visible,
    tagged,
)
from hpwsn_site.api.schema import problem_responses
from hpwsn_site.clients import request_client
from hpwsn_site.soap import base_url
from monitoring.counters import consumer_label
from subscriptions import services
from subscriptions.models import PullPoint, Subscription


def _actor(request: Request) -> str:
    return principal_of(request).name or "anonymous"


def _subscription(request: Request, sub_id: str, operation: str) -> Subscription:
    try:
        sub = Subscription.objects.select_related("pull_point").filter(id=uuid.UUID(sub_id)).first()
    except ValueError:
        sub = None
    if sub is None:
        raise errors.ResourceUnknown(f"subscription {sub_id} does not exist")
    subscription_authorize(principal=principal_of(request), subscription=sub, operation=operation)
    return sub


def _pull_point(request: Request, pp_id: str, operation: str) -> PullPoint:
    try:
        pp = PullPoint.objects.filter(id=uuid.UUID(pp_id)).first()
    except ValueError:
        pp = None
    if pp is None or (pp.destroyed_at is not None and operation != "destroy"):
        raise errors.ResourceUnknown(f"pull point {pp_id} does not exist")
    subscription_authorize(principal=principal_of(request), subscription=pp, operation=operation)
    return pp


def topic_ref(text: str, dialect: str | None, nsmap: dict[str, str]) -> wsn.TopicRef:
    """A topic expression as SOAP carries it; `dialect` a URI, a shorthand or None (guess)."""
    try:
        uri = resolve_dialect(dialect, text)
    except ValueError as exc:
        raise errors.TopicExpressionDialectUnknown(str(exc)) from None
    return wsn.TopicRef(text=text, dialect=uri, nsmap=nsmap)


# ----------------------------------------------------------------------------- shapes


class FilterIn(serializers.Serializer):
    xpath = serializers.CharField(help_text="WSN MessageContent, XPath 1.0")
    namespaces = serializers.DictField(child=serializers.CharField(), required=False)


class SubscriptionIn(serializers.Serializer):
    consumer = serializers.URLField(required=False, help_text="push: the consumer's http(s) URL")
    pullpoint = serializers.UUIDField(required=False, help_text="pull: a pull point's id")
    topic = serializers.CharField(required=False, help_text="a topic expression; none = all")
    dialect = serializers.CharField(
        required=False, help_text="simple, concrete, full, colon or a dialect URI (default: guess)"
    )
    namespaces = serializers.DictField(child=serializers.CharField(), required=False)
    filter = FilterIn(required=False)
    termination = serializers.CharField(
        required=False, help_text="xsd:duration (PT1H) or xsd:dateTime; none = never"
    )
    format = serializers.ChoiceField(choices=Subscription.Format.choices, default="wsn")
    soap_version = serializers.ChoiceField(choices=["1.1", "1.2"], default="1.1")
    use_raw = serializers.BooleanField(default=False)
    signing_secret = serializers.CharField(required=False, default="", max_length=256)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("consumer" in attrs) == ("pullpoint" in attrs):
            raise serializers.ValidationError("give exactly one of 'consumer' or 'pullpoint'")
        return attrs


TAGGED = " Analysts see `#` and a tag instead for what they do not own."


class SubscriptionOut(serializers.Serializer):
    id = serializers.CharField(help_text="the subscription's id (a UUID)." + TAGGED)
    reference = serializers.CharField(
        allow_null=True,
        help_text="the WSN SubscriptionReference address; null for analysts on what they do not "
        "own (the address renews and ends it)",
    )
    mode = serializers.CharField()
    consumer = serializers.CharField(
        help_text="the consumer's address (pull: the pull point's); analysts see its host:port "
        "for what they do not own"
    )
    pullpoint = serializers.CharField(
        allow_null=True, help_text="pull: the pull point's id (a UUID)." + TAGGED
    )
    topic = serializers.CharField()
    dialect = serializers.CharField()
    topic_path = serializers.CharField()
    filter = serializers.CharField()
    format = serializers.CharField()
    state = serializers.CharField()
    termination_time = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()


class SubscriptionDetailOut(SubscriptionOut):
    queued = serializers.IntegerField()
    failures = serializers.IntegerField(help_text="failed attempts at the head batch")
    next_retry = serializers.FloatField(allow_null=True)
    last_delivery = serializers.DateTimeField(allow_null=True)
    dead_letters = serializers.IntegerField()
    attempts = serializers.ListField(child=serializers.JSONField(), help_text="of the head batch")


class RenewIn(serializers.Serializer):
    termination = serializers.CharField(help_text="xsd:duration (PT1H) or xsd:dateTime")


def subscription_out(sub: Subscription, *, reveal: bool = True) -> dict[str, Any]:
    """A subscription as the API shows it; without `reveal`, no id or address that acts on it."""
    out = {
        "id": str(sub.id),
        "reference": sub.reference_address,
        "mode": sub.mode,
        "consumer": sub.consumer_address,
        "pullpoint": str(sub.pull_point_id) if sub.pull_point_id else None,
        "topic": sub.topic_expression,
        "dialect": sub.topic_dialect,
        "topic_path": sub.topic_path,
        "filter": sub.content_filter,
        "format": sub.format,
        "state": sub.state,
        "termination_time": sub.termination_time,
        "created_at": sub.created_at,
    }
    if not reveal:
        out["id"] = tagged(sub.id)
        out["reference"] = None
        out["consumer"] = consumer_label(sub.consumer_address)
        out["pullpoint"] = tagged(sub.pull_point_id) if sub.pull_point_id else None
    return out


def subscription_shown(request: Request, sub: Subscription) -> dict[str, Any]:
    """The subscription as this caller may see it (permissions.reveals)."""
    return subscription_out(sub, reveal=reveals(principal=principal_of(request), owner=sub.owner))


def subscription_detail(request: Request, sub: Subscription) -> dict[str, Any]:
    row = subscription_rows(subs=[sub])[0]
    raw = state.get_redis().lrange(state.attempts_key(str(sub.id)), 0, -1)
    return {
        **subscription_shown(request, sub),
        "queued": row.queued,
        "failures": row.failures,
        "next_retry": row.next_retry,
        "last_delivery": row.last_delivery,
        "dead_letters": row.dead_letters,
        "attempts": [json.loads(a) for a in raw],
    }


class SubscriptionFilter(django_filters.FilterSet):
    topic = django_filters.CharFilter(method="in_subtree", help_text="a topic path: its subtree")
    consumer = django_filters.CharFilter(
        method="consumer_contains",
        help_text="a part of the consumer's address; analysts: of its host:port (what they see), "
        "or of the address of a subscription they own",
    )
    state = django_filters.ChoiceFilter(choices=Subscription.State.choices)
    mode = django_filters.ChoiceFilter(choices=Subscription.Mode.choices)
    format = django_filters.ChoiceFilter(choices=Subscription.Format.choices)

    class Meta:
        model = Subscription
        fields = ["topic", "consumer", "state", "mode", "format"]

    def in_subtree(self, qs: QuerySet[Subscription], name: str, value: str) -> QuerySet[Any]:
        return qs.filter(Q(topic_path=value) | Q(topic_path__startswith=value + ":"))

    def consumer_contains(self, qs: QuerySet[Subscription], name: str, value: str) -> QuerySet[Any]:
        principal = principal_of(self.request)
        if not shows_tags(principal):
            return qs.filter(consumer_address__icontains=value)
        # Analysts match others' subscriptions on the host:port they see, as in the console.
        own = Q(owner__iexact=principal.owner, consumer_address__icontains=value)
        return qs.filter(consumer_host_contains(value) | own)


class ByCreation(CursorPagination):
    ordering = ("-created_at", "-id")
    page_size = 100
    max_page_size = 1000
    page_size_query_param = "limit"


# ----------------------------------------------------------------------------- views


@extend_schema_view(
    get=extend_schema(
        operation_id="subscriptions_list",
        summary="List subscriptions (analysts, operators, admins)",
        responses={200: SubscriptionOut(many=True), **problem_responses(400, 401, 429)},
    ),
    post=extend_schema(
        operation_id="subscriptions_create",
        summary="Subscribe a push consumer or a pull point",
        description=(
            "The same Subscribe as SOAP: the topic's subscribe ACL applies, an identical "
            "subscription (same consumer, expression, filter, format) is returned, not duplicated "
            "(200 instead of 201)."
        ),
        request=SubscriptionIn,
        responses={
            201: SubscriptionOut,
            200: SubscriptionOut,
            **problem_responses(400, 401, 403, 404, 429),
        },
        examples=[
            OpenApiExample(
                "CloudEvents to a webhook",
                {
                    "consumer": "http://127.0.0.1:9000/hook",
                    "topic": "ALL:ALARM",
                    "format": "cloudevents",
                    "termination": "PT1H",
                },
            ),
        ],
    ),
)
class SubscriptionListView(generics.ListAPIView):
    permission_classes = [PolicyDecides]
    serializer_class = SubscriptionOut
    filterset_class = SubscriptionFilter
    pagination_class = ByCreation

    def get_queryset(self) -> QuerySet[Subscription]:
        qs = Subscription.objects.all()
        return subscriptions_visible(principal=principal_of(self.request), queryset=qs)

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        return self.get_paginated_response([subscription_shown(request, s) for s in page or []])

    def post(self, request: Request) -> Response:
        data = SubscriptionIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        nsmap = v.get("namespaces") or {}
        topic = topic_ref(v["topic"], v.get("dialect"), nsmap) if v.get("topic") else None
        content = None
        if v.get("filter"):
            f = v["filter"]
            content = wsn.TopicRef(
                text=f["xpath"], dialect=ns.FILTER_XPATH, nsmap=f.get("namespaces") or {}
            )
        consumer = v.get("consumer", "")
        if "pullpoint" in v:
            consumer = _pull_point(request, str(v["pullpoint"]), "subscribe").address
        sub, created = services.subscription_create(
            consumer_address=consumer,
            topic=topic,
            content=content,
            initial_termination_time=v.get("termination"),
            soap_version=v["soap_version"],
            use_raw=v["use_raw"],
            base_url=base_url(request),
            signing_secret=v["signing_secret"],
            principal=principal_of(request),
            client=request_client(request.META),
            format=v["format"],
        )
        return Response(subscription_out(sub), status=201 if created else 200)


class SubscriptionView(APIView):
    permission_classes = [PolicyDecides]

    @extend_schema(
        operation_id="subscription_get",
        summary="A subscription with its queue depth, last delivery and head-batch attempts",
        responses={200: SubscriptionDetailOut, **problem_responses(401, 403, 404, 429)},
    )
    def get(self, request: Request, sub_id: str) -> Response:
        return Response(subscription_detail(request, _subscription(request, sub_id, "read")))

    @extend_schema(
        operation_id="subscription_delete",
        summary="Unsubscribe: the subscription, its queue and every resource it held go",
        responses={204: None, **problem_responses(401, 403, 404, 429)},
    )
    def delete(self, request: Request, sub_id: str) -> Response:
        _subscription(request, sub_id, "delete")
        console.subscription_remove(subscription_id=sub_id, actor=_actor(request))
        return Response(status=204)


class SubscriptionActionView(APIView):
    permission_classes = [PolicyDecides]
    action_name = ""  # pause, resume, renew

    def post(self, request: Request, sub_id: str) -> Response:
        _subscription(request, sub_id, self.action_name)
        if self.action_name == "renew":
            data = RenewIn(data=request.data)
            data.is_valid(raise_exception=True)
            sub = console.subscription_renew_by_operator(
                subscription_id=sub_id,
                termination_time=data.validated_data["termination"],
                actor=_actor(request),
            )
        else:
            sub = console.subscription_pause_or_resume(
                subscription_id=sub_id, paused=self.action_name == "pause", actor=_actor(request)
            )
        return Response(subscription_shown(request, sub))


def action_view(name: str, summary: str) -> Any:
    request = RenewIn if name == "renew" else None

    def post(self: SubscriptionActionView, request: Request, sub_id: str) -> Response:
        return SubscriptionActionView.post(self, request, sub_id)

    schema = extend_schema(
        operation_id=f"subscription_{name}",
        summary=summary,
        request=request,
        examples=[OpenApiExample("one more hour", {"termination": "PT1H"})] if request else None,
        responses={200: SubscriptionOut, **problem_responses(400, 401, 403, 404, 429)},
    )
    attrs = {"action_name": name, "post": schema(post)}
    return type(f"Subscription{name.title()}View", (SubscriptionActionView,), attrs).as_view()


# ----------------------------------------------------------------------------- pull points


class PullPointOut(serializers.Serializer):
    id = serializers.CharField(help_text="the pull point's id (a UUID)." + TAGGED)
    address = serializers.CharField(
        allow_null=True,
        help_text="the WSN pull point address; null for analysts on what they do not own (the "
        "address reads and destroys it)",
    )
    created_at = serializers.DateTimeField()
    last_used_at = serializers.DateTimeField(allow_null=True)
    queued = serializers.IntegerField(required=False)


class PullIn(serializers.Serializer):
    maximum = serializers.IntegerField(
        required=False, min_value=1, max_value=10_000, help_text="at most this many (1000)"
    )


class PulledOut(serializers.Serializer):
    subscription = serializers.CharField(help_text="SubscriptionReference address")
    topic = serializers.CharField()
    datacontenttype = serializers.CharField()
    data = serializers.JSONField()


def pull_point_out(request: Request, pp: PullPoint, queued: int | None = None) -> dict[str, Any]:
    """A pull point as this caller may see it (permissions.reveals)."""
    reveal = reveals(principal=principal_of(request), owner=pp.owner)
    out: dict[str, Any] = {
        "id": str(pp.id) if reveal else tagged(pp.id),
        "address": pp.address if reveal else None,
        "created_at": pp.created_at,
        "last_used_at": pp.last_used_at,
    }
    if queued is not None:
        out["queued"] = queued
    return out


class PullPointListView(generics.ListAPIView):
    permission_classes = [PolicyDecides]
    serializer_class = PullPointOut
    pagination_class = ByCreation

    def get_queryset(self) -> QuerySet[PullPoint]:
        qs = PullPoint.objects.filter(destroyed_at__isnull=True)
        return subscriptions_visible(principal=principal_of(self.request), queryset=qs)

    @extend_schema(
        operation_id="pullpoints_list",
        summary="List pull points (analysts, operators, admins)",
        responses={200: PullPointOut(many=True), **problem_responses(401, 429)},
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response([pull_point_out(request, p) for p in page or []])

    @extend_schema(
        operation_id="pullpoints_create",
        summary="Create a pull point (CreatePullPoint)",
        description=(
            "403 UnableToCreatePullPointFault when the caller already holds "
            "HPWSN_MAX_PULLPOINTS_PER_OWNER pull points."
        ),
        request=None,
        responses={201: PullPointOut, **problem_responses(401, 403, 429)},
    )
    def post(self, request: Request) -> Response:
        pp = services.pull_point_create(
            base_url=base_url(request),
            principal=principal_of(request),
            client=request_client(request.META),
        )
        return Response(pull_point_out(request, pp), status=201)


class PullPointView(APIView):
    permission_classes = [PolicyDecides]

    @extend_schema(
        operation_id="pullpoint_get",
        summary="A pull point and how many messages wait in it",
        responses={200: PullPointOut, **problem_responses(401, 403, 404, 429)},
    )
    def get(self, request: Request, pp_id: str) -> Response:
        pp = _pull_point(request, pp_id, "read")
        queued = state.get_redis().llen(state.pullpoint_key(str(pp.id)))
        return Response(pull_point_out(request, pp, int(queued)))

    @extend_schema(
        operation_id="pullpoint_destroy",
        summary="Destroy a pull point, its queue and the subscriptions into it",
        responses={204: None, **problem_responses(401, 403, 404, 409, 429)},
    )
    def delete(self, request: Request, pp_id: str) -> Response:
        _pull_point(request, pp_id, "destroy")
        services.pull_point_destroy(pull_point_id=pp_id)
        return Response(status=204)


def _pulled(items: list[tuple[str, bytes]]) -> list[dict[str, Any]]:
    """Pulled messages as the API answers them (built before they leave the pull point)."""
    out = []
    for reference, fragment in items:
        event = cloudevents.event(notification_id="", source="", accepted_at=0.0, fragment=fragment)
        out.append(
            {
                "subscription": reference,
                "topic": event["type"],
                "datacontenttype": event["datacontenttype"],
                "data": event["data"],
            }
        )
    return out


class PullView(APIView):
    permission_classes = [PolicyDecides]

    @extend_schema(
        operation_id="pullpoint_pull",
        summary="Take the oldest messages (GetMessages)",
        request=PullIn,
        examples=[OpenApiExample("at most 100", {"maximum": 100})],
        responses={200: PulledOut(many=True), **problem_responses(400, 401, 403, 404, 429)},
    )
    def post(self, request: Request, pp_id: str) -> Response:
        _pull_point(request, pp_id, "pull")
        data = PullIn(data=request.data or {})
        data.is_valid(raise_exception=True)
        out = services.pull_point_get_messages(
            pull_point_id=pp_id,
            maximum=data.validated_data.get("maximum"),
            render=_pulled,
            request_id=request.headers.get("Idempotency-Key"),
        )
        return Response(out)
