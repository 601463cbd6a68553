"""/api/v1/topics: the tree, create / rename / move / update / delete through the topic services
the console uses (audited), each topic's own and effective (inherited) policy."""

from __future__ import annotations

import dataclasses
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from hpwsn import errors
from hpwsn_site.api.auth import principal_of
from hpwsn_site.api.permissions import OperatorsWriteAnalystsRead
from hpwsn_site.api.schema import problem_responses
from subscriptions import cascades
from topics import services
from topics.models import Topic
from topics.selectors import POLICY_FIELDS, topic_tree


class TopicOut(serializers.Serializer):
    id = serializers.IntegerField()
    path = serializers.CharField()
    name = serializers.CharField()
    parent = serializers.CharField(allow_null=True, help_text="the parent's path")
    namespace = serializers.CharField()
    description = serializers.CharField()
    policy = serializers.DictField(help_text="what this topic sets itself (null: inherited)")


class TopicDetailOut(TopicOut):
    effective_policy = serializers.DictField(help_text="with every inherited value")


class TopicIn(serializers.Serializer):
    path = serializers.CharField(max_length=1024, help_text="ALL:ALARM:NEW (ancestors created)")
    namespace = serializers.CharField(required=False, default="", allow_blank=True)
    description = serializers.CharField(required=False, default="", allow_blank=True)


class TopicPatchIn(serializers.Serializer):
    name = serializers.CharField(required=False, help_text="rename (the subtree follows)")
    parent = serializers.CharField(
        required=False, allow_null=True, help_text="move under this path; null: make it a root"
    )
    description = serializers.CharField(required=False, allow_blank=True)
    namespace = serializers.CharField(required=False, allow_blank=True)
    policy = serializers.DictField(required=False, help_text="policy fields to set ('' inherits)")


def _own_policy(t: Topic) -> dict[str, Any]:
    return {f: getattr(t, f) for f in POLICY_FIELDS}


def topic_out(t: Topic, paths: dict[int, str]) -> dict[str, Any]:
    return {
        "id": t.pk,
        "path": t.path,
        "name": t.name,
        "parent": paths.get(t.parent_id) if t.parent_id else None,
        "namespace": t.namespace,
        "description": t.description,
        "policy": _own_policy(t),
    }


def effective_policy(path: str) -> dict[str, Any]:
    node = topic_tree(max_age=0).get(path)
    if node is None:
        return {}
    return {
        k: list(v) if isinstance(v, tuple) else v
        for k, v in dataclasses.asdict(node.policy).items()
    }


def _topic(path: str) -> Topic:
    t = Topic.objects.filter(path=path).first()
    if t is None:
        raise errors.TopicNotSupported(f"topic '{path}' is not in the topic tree")
    return t


class TopicListView(APIView):
    permission_classes = [OperatorsWriteAnalystsRead]

    @extend_schema(
        operation_id="topics_list",
        summary="The topic tree: flat (default) or nested",
        parameters=[OpenApiParameter("nested", bool, description="children inside their parent")],
        responses={200: TopicOut(many=True), **problem_responses(401, 403, 429)},
    )
    def get(self, request: Request) -> Response:
        topics = list(Topic.objects.order_by("path"))
        paths = {t.pk: t.path for t in topics}
        rows = [topic_out(t, paths) for t in topics]
        if request.query_params.get("nested", "").lower() not in ("1", "true", "yes"):
            return Response(rows)
        by_path: dict[str, dict[str, Any]] = {}
        roots = []
        for row in rows:  # sorted by path: a parent comes before its children
            row["children"] = []
            by_path[row["path"]] = row
            parent = by_path.get(row["parent"] or "")
            (parent["children"] if parent else roots).append(row)
        return Response(roots)

    @extend_schema(
        operation_id="topics_create",
        summary="Create a topic (and its missing ancestors)",
        request=TopicIn,
        examples=[OpenApiExample("a new alarm topic", {"path": "ALL:ALARM:ALARM3"})],
        responses={201: TopicOut, **problem_responses(400, 401, 403, 429)},
    )
    def post(self, request: Request) -> Response:
        data = TopicIn(data=request.data)
        data.is_valid(raise_exception=True)
        try:
            t = services.topic_create(**data.validated_data, actor=principal_of(request).name or "")
        except ValueError as exc:
            raise ValidationError({"path": [str(exc)]}) from None
        return Response(topic_out(t, {t.parent_id: t.parent.path} if t.parent else {}), status=201)


class TopicView(APIView):
    permission_classes = [OperatorsWriteAnalystsRead]

    @extend_schema(
        operation_id="topic_get",
        summary="A topic with its own and its effective (inherited) policy",
        responses={200: TopicDetailOut, **problem_responses(401, 403, 404, 429)},
    )
    def get(self, request: Request, path: str) -> Response:
        t = _topic(path)
        out = topic_out(t, {t.parent_id: t.parent.path} if t.parent else {})
        return Response({**out, "effective_policy": effective_policy(t.path)})

    @extend_schema(
        operation_id="topic_update",
        summary="Rename, move, describe or set the policy of a topic",
        request=TopicPatchIn,
        examples=[
            OpenApiExample("rename", {"name": "ALARM9"}),
            OpenApiExample("move under another topic", {"parent": "ALL:ALARM"}),
            OpenApiExample("policy", {"policy": {"reliability": "fast", "priority": 7}}),
        ],
        responses={200: TopicDetailOut, **problem_responses(400, 401, 403, 404, 429)},
    )
    def patch(self, request: Request, path: str) -> Response:
        data = TopicPatchIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        actor = principal_of(request).name or ""
        t = _topic(path)
        changes = {k: v[k] for k in ("description", "namespace") if k in v}
        changes.update(v.get("policy") or {})
        with transaction.atomic():
            if changes:
                services.topic_update(topic_id=t.pk, changes=changes, actor=actor)
            if "name" in v:
                cascades.topic_rename(topic_id=t.pk, name=v["name"], actor=actor)
            if "parent" in v:
                parent_id = _topic(v["parent"]).pk if v["parent"] else None
                cascades.topic_move(topic_id=t.pk, parent_id=parent_id, actor=actor)
        t.refresh_from_db()
        out = topic_out(t, {t.parent_id: t.parent.path} if t.parent else {})
        return Response({**out, "effective_policy": effective_policy(t.path)})

    @extend_schema(
        operation_id="topic_delete",
        summary="Delete a topic and its subtree",
        parameters=[
            OpenApiParameter(
                "subscriptions",
                str,
                enum=["keep", "delete"],
                required=True,
                description="what happens to the subscriptions below (as in the console)",
            )
        ],
        responses={204: None, **problem_responses(400, 401, 403, 404, 429)},
    )
    def delete(self, request: Request, path: str) -> Response:
        choice = request.query_params.get("subscriptions", "")
        if choice not in ("keep", "delete"):
            raise ValidationError({"subscriptions": ["must be 'keep' or 'delete'"]})
        cascades.topic_delete(
            topic_id=_topic(path).pk, subscriptions=choice, actor=principal_of(request).name or ""
        )
        return Response(status=204)
