"""Writes to the topic tree. Every change is appended to the change log (topics/changes.py), in
its transaction, so every process loads again the subtree that changed."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q

from audit.services import Actor, audit_record
from hpwsn import ns
from hpwsn.topicexpr import MAX_DEPTH, TopicExpressionError, split_colon_path
from hpwsn_site import state
from topics.changes import SUBSCRIPTION, TOPIC, change_batch, change_record
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
                    after=_snapshot(parent),
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


def _snapshot(topic: Topic) -> dict[str, Any]:
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
        before = _snapshot(topic)
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
                after=_snapshot(topic),
            )
        change_record(kind=TOPIC, keys=[topic.path])  # its policy is its subtree's
    return topic


def topic_rename(*, topic_id: int, name: str, actor: Actor | str | None = None) -> Topic:
    """Give a topic a new name; the paths of its whole subtree and its subscriptions follow."""
    with transaction.atomic():
        topic = _locked(topic_id)
        return _relocate(topic, parent=topic.parent, name=name, action="topic.rename", actor=actor)


def topic_move(*, topic_id: int, parent_id: int | None, actor: Actor | str | None = None) -> Topic:
    """Hang a topic (and its subtree) under another parent, or make it a root (parent_id None)."""
    with transaction.atomic():
        topic = _locked(topic_id)
        parent = None
        if parent_id is not None:
            parent = Topic.objects.filter(pk=parent_id).first()
            if parent is None:
                raise ValidationError({"parent": [f"topic {parent_id} does not exist"]})
        return _relocate(topic, parent=parent, name=topic.name, action="topic.move", actor=actor)


def _locked(topic_id: int) -> Topic:
    topic = Topic.objects.select_for_update().filter(pk=topic_id).first()
    if topic is None:
        raise ValidationError(f"topic {topic_id} does not exist")
    return topic


def _subtree(path: str) -> Q:
    return Q(path=path) | Q(path__startswith=path + ":")


def _relocate(
    topic: Topic, *, parent: Topic | None, name: str, action: str, actor: Actor | str | None
) -> Topic:
    try:
        names = split_colon_path(name)
    except TopicExpressionError as exc:
        raise ValidationError({"name": [str(exc)]}) from None
    if len(names) != 1:
        raise ValidationError({"name": [f"'{name}' is a path, not a single topic name"]})
    name = names[0]
    old_path = topic.path
    if parent is not None and (parent.pk == topic.pk or parent.path.startswith(old_path + ":")):
        raise ValidationError(
            {"parent": [f"'{old_path}' cannot move under itself or one of its descendants"]}
        )
    new_path = f"{parent.path}:{name}" if parent is not None else name
    if new_path == old_path:
        return topic
    if Topic.objects.filter(path=new_path).exists():
        raise ValidationError({"name": [f"a topic '{new_path}' already exists"]})
    descendants = list(Topic.objects.filter(path__startswith=old_path + ":"))
    deepest = max((d.path.count(":") for d in descendants), default=old_path.count(":"))
    if deepest - old_path.count(":") + new_path.count(":") + 1 > MAX_DEPTH:
        raise ValidationError({"parent": [f"the subtree would be deeper than {MAX_DEPTH} levels"]})
    before = _snapshot(topic)
    topic.name = name
    topic.parent = parent
    topic.path = new_path
    if parent is not None:
        topic.namespace = ""  # only roots carry a namespace
    topic.save(update_fields=["name", "parent", "path", "namespace", "updated_at"])
    for d in descendants:
        d.path = new_path + d.path[len(old_path) :]
    Topic.objects.bulk_update(descendants, ["path"])
    moved = _subscriptions_follow(old_path, new_path)
    if actor is not None:
        after = _snapshot(topic)
        after["descendants"] = len(descendants)
        after["subscriptions"] = len(moved)
        audit_record(
            actor=actor,
            action=action,
            object_type=AUDIT_TYPE,
            object_id=old_path,
            before=before,
            after=after,
        )
    change_record(kind=SUBSCRIPTION, keys=moved)
    change_record(kind=TOPIC, keys=[old_path, new_path])
    return topic


def _subscriptions_follow(old_path: str, new_path: str) -> list[str]:
    """Point the subscriptions to topics of a renamed or moved subtree at their new paths.

    A concrete subscription names one topic node, so it follows the node; its expression becomes
    the node's colon path. Wildcard (Full dialect) expressions are patterns and are left as
    written: they match whatever the tree holds.
    """
    from subscriptions.models import Subscription

    subs = list(
        Subscription.objects.filter(
            Q(topic_path=old_path) | Q(topic_path__startswith=old_path + ":")
        )
    )
    from hpwsn import topicexpr
    from subscriptions.services import subscription_dedup_key

    keys = {}
    for sub in subs:
        sub.topic_path = new_path + sub.topic_path[len(old_path) :]
        sub.topic_expression = sub.topic_path
        sub.topic_dialect = ns.DIALECT_COLON
        sub.topic_nsmap = {}
        # An identical Subscribe to the new path must find this subscription, not make another.
        keys[sub.pk] = subscription_dedup_key(
            owner=sub.owner,
            mode=sub.mode,
            target=sub.consumer_address,
            canonical=topicexpr.parse(sub.topic_path, ns.DIALECT_COLON, {}).canonical(),
            content_dialect=sub.content_dialect,
            content_filter=sub.content_filter,
            filter_parameters=sub.filter_parameters,
            producer_filter=sub.producer_filter,
            format=sub.format,
        )
    taken = set(
        Subscription.objects.filter(dedup_key__in=keys.values()).values_list("dedup_key", flat=True)
    )
    for sub in subs:
        key = keys[sub.pk]
        if key not in taken:
            taken.discard(sub.dedup_key)
            sub.dedup_key = key
            taken.add(key)
    Subscription.objects.bulk_update(
        subs, ["topic_path", "topic_expression", "topic_dialect", "topic_nsmap", "dedup_key"]
    )
    from directory.outbox import subscription_directory_write

    ids = [sub.id for sub in subs]
    transaction.on_commit(lambda: subscription_directory_write(subscription_ids=ids))
    return [str(i) for i in ids]


@dataclass(frozen=True, slots=True)
class TopicDeleted:
    topics: int  # the topic and its descendants
    subscriptions_deleted: int
    subscriptions_kept: int


def topic_delete(
    *,
    topic_id: int,
    subscriptions: Literal["keep", "delete"],
    actor: Actor | str | None = None,
) -> TopicDeleted:
    """Delete a topic and its subtree; its subscriptions are unsubscribed or kept, as asked.

    Kept subscriptions stay registered with their topic path: they receive again if a topic of
    that path is created later (by an operator, or by auto-create).
    """
    from subscriptions.models import Subscription
    from subscriptions.services import subscription_delete

    if subscriptions not in ("keep", "delete"):
        raise ValidationError({"subscriptions": ["must be 'keep' or 'delete'"]})
    with transaction.atomic(), change_batch():
        topic = _locked(topic_id)
        paths = list(Topic.objects.filter(_subtree(topic.path)).values_list("path", flat=True))
        sub_ids = [
            str(i)
            for i in Subscription.objects.filter(
                Q(topic_path=topic.path) | Q(topic_path__startswith=topic.path + ":")
            ).values_list("id", flat=True)
        ]
        before = {**_snapshot(topic), "subtree": paths, "subscription_ids": sub_ids}
        if subscriptions == "delete":
            for sub_id in sub_ids:
                subscription_delete(subscription_id=sub_id)
        topic.delete()  # the children go with it (ON DELETE CASCADE)
        change_record(kind=TOPIC, keys=[topic.path])
        result = TopicDeleted(
            topics=len(paths),
            subscriptions_deleted=len(sub_ids) if subscriptions == "delete" else 0,
            subscriptions_kept=len(sub_ids) if subscriptions == "keep" else 0,
        )
        if actor is not None:
            audit_record(
                actor=actor,
                action="topic.delete",
                object_type=AUDIT_TYPE,
                object_id=before["path"],
                before=before,
                after={
                    "subscriptions": subscriptions,
                    "topics_deleted": result.topics,
                    "subscriptions_deleted": result.subscriptions_deleted,
                    "subscriptions_kept": result.subscriptions_kept,
                },
            )

        def _after_commit() -> None:
            # The last message of a deleted topic must not come back with a re-created one.
            r = state.get_redis()
            r.delete(*[state.current_key(p) for p in paths])

        transaction.on_commit(_after_commit)
    return result
