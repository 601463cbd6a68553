"""POST /api/v1/topics/{path}/messages (publish) and GET (the current message).

The payloads become the NotificationMessages a SOAP Notify would carry (hpwsn/restpublish.py) and
go to the same `dispatch.accept.notifications_accept` as a Notify: the same topic resolution,
ACL, auto-create, idempotency window and storage (reliable topics committed before the 202).
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from django.conf import settings
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from redis.exceptions import RedisError
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from dispatch import accept as dispatch
from hpwsn import cloudevents, errors, ns, restpublish, wsn
from hpwsn_site.api.auth import principal_of
from hpwsn_site.api.exceptions import ServiceUnavailable
from hpwsn_site.api.parsers import JsonParser, TextXmlParser, XmlParser
from hpwsn_site.api.permissions import PolicyDecides
from hpwsn_site.api.schema import problem_responses
from hpwsn_site.clients import request_client
from hpwsn_site.soapcall import publish_key
from topics import acl

MAX_BATCH = 1000


class MessageIn(serializers.Serializer):
    xml = serializers.CharField(required=False, help_text="an XML payload: one element")
    json = serializers.JSONField(required=False, help_text="a JSON payload: any JSON value")


class PublishIn(serializers.Serializer):
    xml = serializers.CharField(required=False, help_text="one message: an XML payload")
    json = serializers.JSONField(required=False, help_text="one message: a JSON payload")
    messages = MessageIn(many=True, required=False, help_text=f"a batch of up to {MAX_BATCH}")


class PublishOut(serializers.Serializer):
    topic = serializers.CharField()
    ids = serializers.ListField(child=serializers.CharField(), help_text="stable message ids")


class CurrentOut(serializers.Serializer):
    topic = serializers.CharField()
    datacontenttype = serializers.CharField()
    data = serializers.JSONField(help_text="XML as a string, or the JSON value")


def _messages(data: Any) -> list[dict[str, Any]]:
    if not isinstance(data, dict):
        raise errors.WsnError("the body must be a JSON object (or an XML document)")
    batch = data.get("messages")
    if batch is None:
        return [data]
    if not isinstance(batch, list) or not batch or len(batch) > MAX_BATCH:
        raise errors.WsnError(f"'messages' must be a list of 1 to {MAX_BATCH} messages")
    if "xml" in data or "json" in data:
        raise errors.WsnError("give either one message (xml or json) or 'messages', not both")
    return batch


def _notification(topic: str, m: Any) -> wsn.NotificationIn:
    if not isinstance(m, dict) or set(m) - {"xml", "json"}:
        raise errors.WsnError("a message is an object with exactly one of 'xml' or 'json'")
    xml = m.get("xml")
    if xml is not None and not isinstance(xml, str):
        raise errors.WsnError("'xml' must be a string holding one XML element")
    try:
        return restpublish.notification_of(
            topic=topic,
            xml=xml,
            json_value=m.get("json"),
            has_json="json" in m,
            max_bytes=settings.HPWSN_MAX_REQUEST_BYTES,
            max_depth=settings.HPWSN_MAX_XML_DEPTH,
        )
    except restpublish.PayloadRejected as exc:
        raise errors.WsnError(str(exc)) from None


async def publish_accept(
    *, topic: str, data: Any, principal: acl.Principal, key: str | None, client: str
) -> list[str]:
    """Validate, then store every message as a Notify would; the ids in order.

    Shared by the DRF view and the ASGI fast path (hpwsn_site/api/fastpublish.py).
    """
    notifications = [_notification(topic, m) for m in _messages(data)]
    try:
        return await dispatch.notifications_accept(
            notifications=notifications,
            principal=principal,
            client=client,
            idempotency_key=publish_key(principal, key, client=client),
        )
    except RedisError:
        raise ServiceUnavailable("the broker cannot store messages now; retry later") from None


def current_message(*, topic: str, principal: acl.Principal) -> dict[str, Any]:
    """The last message published on exactly this topic (GetCurrentMessage)."""
    content = async_to_sync(dispatch.current_message_get)(
        topic=wsn.TopicRef(text=topic, dialect=ns.DIALECT_SIMPLE, nsmap={}), principal=principal
    )
    datacontenttype, data = cloudevents.payload_data(content)
    return {"topic": topic, "datacontenttype": datacontenttype, "data": data}


class TopicMessagesView(APIView):
    permission_classes = [PolicyDecides]
    throttle_scope = "publish"
    parser_classes = [JsonParser, XmlParser, TextXmlParser]

    def get_throttles(self) -> list[Any]:
        if self.request.method != "POST":
            self.throttle_scope = "api"
        return super().get_throttles()

    @extend_schema(
        operation_id="topic_publish",
        summary="Publish one message or a batch",
        description=(
            "Answered 202 once every message is stored exactly as a SOAP Notify is (reliable "
            "topics: committed to the database first). A repeated Idempotency-Key within the "
            "dedup window stores nothing and returns the first ids. The topic's ACL applies."
        ),
        parameters=[
            OpenApiParameter(
                "Idempotency-Key", str, OpenApiParameter.HEADER, description="same as wsa:MessageID"
            )
        ],
        request=PublishIn,
        responses={202: PublishOut, **problem_responses(400, 401, 403, 404, 429, 503)},
        examples=[
            OpenApiExample("one XML message", {"xml": '<alarm xmlns="urn:demo">fire</alarm>'}),
            OpenApiExample("one JSON message", {"json": {"level": 3, "text": "fire"}}),
            OpenApiExample("a batch", {"messages": [{"json": {"n": 1}}, {"json": {"n": 2}}]}),
        ],
    )
    def post(self, request: Request, path: str) -> Response:
        ids = async_to_sync(publish_accept)(
            topic=path,
            data=request.data,
            principal=principal_of(request),
            key=request.headers.get("Idempotency-Key"),
            client=request_client(request.META),
        )
        return Response({"topic": path, "ids": ids}, status=202)

    @extend_schema(
        operation_id="topic_current_message",
        summary="The last message published on this topic (GetCurrentMessage)",
        responses={200: CurrentOut, **problem_responses(401, 403, 404, 429)},
    )
    def get(self, request: Request, path: str) -> Response:
        return Response(current_message(topic=path, principal=principal_of(request)))
