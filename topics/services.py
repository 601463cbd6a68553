"""Writes to the topic tree. Every change is appended to the change log (topics/changes.py), in
its transaction, so every process loads again the subtree that changed.

Renames, moves and deletes carry subscriptions with them: subscriptions/cascades.py."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from audit.services import Actor, audit_record
from hpwsn.topicexpr import TopicExpressionError, split_colon_path
from topics.changes import TOPIC, change_record
from topics.models import Topic
from topics.selectors import BOOL_POLICY_FIELDS, POLICY_FIELDS

DEMO_TREE: tuple[str, ...] = (
    "ALL:ALARM:ALARM1:ALARM11",
    "ALL:ALARM:ALARM1:ALARM12",
    "ALL:ALARM:ALARM1:ALARM13",
    "ALL:ALARM:ALARM1:ALARM14",
    "ALL:ALARM:ALARM1:ALARM15",
    "ALL:ALARM:ALARM1:ALARM11:ALARM111",
    "ALL:ALARM:ALARM1:ALARM11:ALARM112",
    "ALL:ALARM:ALARM1:ALARM11:ALARM113",
    "ALL:ALARM:ALARM1:ALARM11:ALARM114",
    "ALL:ALARM:ALARM1:ALARM11:ALARM115",
    "ALL:ALARM:ALARM2",
    "ALL1",
    "ALL2",
    "ALL3",
    "Object:Food:Fruit:Apple",
    "Object:Food:Fruit:Pear",
    "Object:Food:Fruit:Grape",
    "Object:Food:Bread",
    "Object:Tool",
)


def topic_names_check(names: tuple[str, ...]) -> None:
    """ValueError unless every name and the whole colon path fit a topic's columns."""
    name_max, path_max = _max_length("name"), _max_length("path")
    for name in names:
        if name_max is not None and len(name) > name_max:
            raise ValueError(f"topic name '{name[:40]}...' is longer than {name_max} characters")
    path = ":".join(names)
    if path_max is not None and len(path) > path_max:
        raise ValueError(f"topic path '{path[:40]}...' is longer than {path_max} characters")


def topic_create(
    *,
    path: str,
    namespace: str = "",
    description: str = "",
    actor: Actor | str | None = None,
) -> Topic:
    """Create a topic and any missing ancestors; an existing topic is returned unchanged."""
    try:
        names = split_colon_path(path)
    except TopicExpressionError as exc:
        raise ValueError(str(exc)) from None
    topic_names_check(names)
    if namespace:
        namespace = _clean_namespace(namespace)
    with transaction.atomic():
        parent: Topic | None = None
        top_created = ""
        for depth in range(1, len(names) + 1):
            sub_path = ":".join(names[:depth])
            parent, created = Topic.objects.get_or_create(
                path=sub_path,
                defaults={
                    "name": names[depth - 1],
                    "parent": parent,
                    "namespace": namespace if depth == 1 else "",
                    "description": description if depth == len(names) else "",
                },
            )
            if created and not top_created:
                top_created = sub_path  # its subtree holds every topic created here
            if created and actor is not None:
                audit_record(
                    actor=actor,
                    action="topic.create",
                    object_type=AUDIT_TYPE,
                    object_id=sub_path,
                    after=topic_snapshot(parent),
                )
        change_record(kind=TOPIC, keys=[top_created] if top_created else [])
    assert parent is not None
    return parent


def topics_load_demo() -> int:
    """Load the thesis's demo trees (idempotent); returns the number of topics in the tree."""
    for path in DEMO_TREE:
        topic_create(path=path)
    # The thesis's publishers and subscribers are anonymous: its demo roots say so explicitly
    # (the top of the tree refuses anonymous callers). A decision already made is kept.
    roots = {path.split(":", 1)[0] for path in DEMO_TREE}
    with transaction.atomic():
        for field in ("anonymous_publish", "anonymous_subscribe"):
            demo_roots = Topic.objects.filter(parent=None, path__in=roots, **{field: None})
            paths = list(demo_roots.values_list("path", flat=True))
            if demo_roots.update(**{field: True}):
                change_record(kind=TOPIC, keys=paths)
    return Topic.objects.count()


# ----------------------------------------------------------------------------- operators' edits

AUDIT_TYPE = "topic"
_GROUP_FIELDS = frozenset({"publish_groups", "subscribe_groups"})
_MAX_UINT = 2**31 - 1
_MAX_RETRY_STEPS = 32


def _max_length(field: str) -> int | None:
    limit = getattr(Topic._meta.get_field(field), "max_length", None)
    return int(limit) if limit is not None else None


def topic_snapshot(topic: Topic) -> dict[str, Any]:
    """The audited state of a topic: identity, description and its own (not inherited) policy."""
    snap: dict[str, Any] = {
        "id": topic.pk,
        "path": topic.path,
        "name": topic.name,
        "parent": topic.path.rpartition(":")[0] or None,
        "namespace": topic.namespace,
        "description": topic.description,
    }
    for field in POLICY_FIELDS:
        snap[field] = getattr(topic, field)
    return snap


def _clean_namespace(value: object) -> str:
    text = _clean_text(value, limit=512)
    if any(c.isspace() for c in text):
        raise ValueError("a namespace is a URI and contains no spaces")
    return text


def _clean_text(value: object, *, limit: int) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError("must be text")
    text = value.strip()
    if len(text) > limit:
        raise ValueError(f"is longer than {limit} characters")
    return text


def _clean_bool(value: object) -> bool | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError("must be true, false or empty (inherit)")


def _clean_uint(value: object, *, low: int = 0, high: int = _MAX_UINT) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ValueError("must be a whole number")
    if isinstance(value, str):
        if not value.strip().isdigit():
            raise ValueError(f"must be a whole number from {low} to {high}")
        value = int(value.strip())
    if not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"must be a whole number from {low} to {high}")
    return value


def _clean_retry_schedule(value: object) -> str:
    if value is None or value == "":
        return ""
    items: Iterable[object]
    if isinstance(value, str):
        items = [x.strip() for x in value.split(",")]
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        raise ValueError("must be a comma separated list of seconds")
    steps: list[float] = []
    for item in items:
        try:
            step = float(item)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ValueError(f"'{item}' is not a number of seconds") from None
        if not math.isfinite(step) or step < 0:
            raise ValueError(f"'{item}' is not a non-negative number of seconds")
        steps.append(step)
    if len(steps) > _MAX_RETRY_STEPS:
        raise ValueError(f"has more than {_MAX_RETRY_STEPS} steps")
    text = ",".join(f"{s:g}" for s in steps)
    limit = _max_length("retry_schedule")
    if limit is not None and len(text) > limit:
        raise ValueError(f"is longer than {limit} characters")
    return text


def _clean_groups(value: object, *, field: str) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, str):
        names = [x.strip() for x in value.split(",")]
    elif isinstance(value, (list, tuple)):
        names = [str(x).strip() for x in value]
    else:
        raise ValueError("must be a comma separated list of group names")
    clean: list[str] = []
    for name in names:
        if not name:
            continue
        # Group names become LDAP cn values and filter terms: keep them to a safe alphabet.
        # "*" stands for any authenticated user.
        if name != "*" and (len(name) > 64 or not all(c.isalnum() or c in "-_. " for c in name)):
            raise ValueError(f"'{name}' is not a valid group name")
        if name not in clean:
            clean.append(name)
    text = ",".join(clean)
    limit = _max_length(field)
    if limit is not None and len(text) > limit:
        raise ValueError(f"is longer than {limit} characters")
    return text


def _clean_field(field: str, value: object) -> object:
    if field == "reliability":
        text = "" if value is None else value
        if text not in ("", *Topic.Reliability.values):
            raise ValueError("must be 'reliable' or 'fast' (or empty to inherit)")
        return text
    if field in BOOL_POLICY_FIELDS:
        return _clean_bool(value)
    if field == "retry_schedule":
        return _clean_retry_schedule(value)
    if field == "priority":
        return _clean_uint(value, high=9)
    if field == "ttl_seconds":
        return _clean_uint(value)
    if field == "fragment_size":
        size = _clean_uint(value)
        if size is not None and 0 < size < 4:
            raise ValueError("must be 0 (never split) or at least 4 bytes")
        return size
    if field in _GROUP_FIELDS:
        return _clean_groups(value, field=field)
    if field == "description":
        return _clean_text(value, limit=10_000)
    raise AssertionError(field)


def topic_update(
    *, topic_id: int, changes: Mapping[str, object], actor: Actor | str | None = None
) -> Topic:
    """Change a topic's description, namespace (roots only) and policy; ValidationError if bad."""
    allowed = {"description", "namespace", *POLICY_FIELDS}
    errors: dict[str, list[str]] = {}
    for field in changes:
        if field not in allowed:
            errors.setdefault(field, []).append(f"'{field}' is not an editable topic field")
    with transaction.atomic():
        topic = Topic.objects.select_for_update().filter(pk=topic_id).first()
        if topic is None:
            raise ValidationError(f"topic {topic_id} does not exist")
        clean: dict[str, object] = {}
        for field, value in changes.items():
            if field not in allowed:
                continue
            try:
                if field == "namespace":
                    clean[field] = _clean_namespace(value)
                    if clean[field] and topic.parent_id is not None:
                        raise ValueError("only a root topic carries a namespace")
                else:
                    clean[field] = _clean_field(field, value)
            except ValueError as exc:
                errors.setdefault(field, []).append(str(exc))
        if errors:
            raise ValidationError(errors)
        before = topic_snapshot(topic)
        changed = [f for f, v in clean.items() if getattr(topic, f) != v]
        if not changed:
            return topic
        for field in changed:
            setattr(topic, field, clean[field])
        topic.save(update_fields=[*changed, "updated_at"])
        if actor is not None:
            audit_record(
                actor=actor,
                action="topic.update",
                object_type=AUDIT_TYPE,
                object_id=topic.path,
                before=before,
                after=topic_snapshot(topic),
            )
        change_record(kind=TOPIC, keys=[topic.path])  # its policy is its subtree's
    return topic
