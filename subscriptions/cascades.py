"""Renaming, moving and deleting topics: the topic tree's changes that carry the subscriptions to
those topics with them (their paths follow a renamed or moved topic; a deleted topic's are
unsubscribed or kept). They touch both apps, so they live in the higher one; a change that stays
within the tree (create, update) is in topics/services.py."""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass
from typing import Literal

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q

from audit.services import Actor, audit_record
from directory.outbox import subscription_directory_write
from hpwsn import errors, ns, topicexpr
from hpwsn.topicexpr import MAX_DEPTH, TopicExpressionError, split_colon_path
from hpwsn_site import state
from subscriptions.models import Subscription
from subscriptions.services import subscription_dedup_key, subscription_delete
from topics.changes import SUBSCRIPTION, TOPIC, change_batch, change_record
from topics.models import Topic
from topics.services import AUDIT_TYPE, topic_snapshot


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
    before = topic_snapshot(topic)
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
        after = topic_snapshot(topic)
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
    subs = list(
        Subscription.objects.filter(
            Q(topic_path=old_path) | Q(topic_path__startswith=old_path + ":")
        )
    )
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
            interest_path=sub.interest_path,
            signing_secret=sub.signing_secret,
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
    if subscriptions not in ("keep", "delete"):
        raise ValidationError({"subscriptions": ["must be 'keep' or 'delete'"]})
    with transaction.atomic(), change_batch():
        topic = _locked(topic_id)
        # The whole subtree, locked before Django collects what refers to it: a link the directory
        # push writes to one of these topics meanwhile waits, and fails once they are gone,
        # instead of landing after the collection and failing this delete at commit.
        paths = list(
            Topic.objects.select_for_update()
            .filter(_subtree(topic.path))
            .order_by("path")
            .values_list("path", flat=True)
        )
        sub_ids = [
            str(i)
            for i in Subscription.objects.filter(
                Q(topic_path=topic.path) | Q(topic_path__startswith=topic.path + ":")
            ).values_list("id", flat=True)
        ]
        before = {**topic_snapshot(topic), "subtree": paths, "subscription_ids": sub_ids}
        if subscriptions == "delete":
            for sub_id in sub_ids:
                with suppress(errors.ResourceUnknown):  # unsubscribed or expired meanwhile
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
